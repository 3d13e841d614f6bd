"""pyarrow for the Hugging Face format: importing it, what it raises for damaged data, the image
column's parts, and Arrow IPC record batches with where their bodies lie in the file."""
from __future__ import annotations

from packer.core.deps import optional_import

#: Rows per batch read (scan and lazy reads): bounds the bytes in memory at once.
BATCH_ROWS = 64
#: Read buffer of a parquet column chunk: pages stream through it (not the whole chunk at once).
READ_BUFFER = 1 << 20
META_KEY = b"huggingface"
PACKER_KEY = b"packer"


def require_pyarrow():
    """``(pyarrow, pyarrow.parquet)``; DependencyError saying what to install when missing."""
    pa = optional_import("pyarrow", "Hugging Face datasets input and output", "interchange")
    import pyarrow.ipc  # noqa: F401  (a pyarrow that imports has its submodules)
    import pyarrow.parquet as pq
    return pa, pq


def release_memory() -> None:
    """Hand the memory of the batches read so far back to the system: Arrow's default allocator
    (mimalloc) keeps freed pages otherwise, and the process grows by tens of MB per row group."""
    pa, _ = require_pyarrow()
    pa.default_memory_pool().release_unused()


def data_errors() -> tuple:
    """What pyarrow raises for damaged data (ArrowInvalid is a ValueError, IO errors OSErrors)."""
    pa, _ = require_pyarrow()
    return (pa.ArrowException, OSError, ValueError, EOFError)


def one_line(exc: BaseException) -> str:
    """An exception's message on one printable line (pyarrow's hold newlines and raw bytes)."""
    text = "".join(c if c.isprintable() else " " for c in str(exc))
    return " ".join(text.split()) or type(exc).__name__


def image_parts(img):
    """(bytes array, list of paths or Nones) of an image column."""
    pa, _ = require_pyarrow()
    if pa.types.is_struct(img.type):
        parts = img.flatten()
        typ = img.type
        data = parts[typ.get_field_index("bytes")]
        paths = parts[typ.get_field_index("path")].to_pylist()
        return data, paths
    return img, [None] * len(img)


def arrow_batches(source, start: int = 0):
    """``(index, batch, body buffer, body offset in the file)`` per record batch of an Arrow IPC
    stream (``save_to_disk``) or file; batches before ``start`` are skipped undecoded.

    ``source`` is a local path, or a readable seekable file object (an object in a bucket,
    :class:`packer.interchange.hf.bucket.WindowedFile`), closed at the end."""
    pa, _ = require_pyarrow()
    with (pa.OSFile(source) if isinstance(source, str) else pa.PythonFile(source, mode="r")) as fh:
        if fh.read(6) == b"ARROW1":   # the file format: a stream after 8 bytes, a footer after it
            fh.seek(8)
        else:
            fh.seek(0)
        messages = pa.ipc.MessageReader.open_stream(fh)
        schema, index = None, 0
        while True:
            try:
                msg = messages.read_next_message()
            except StopIteration:
                return
            if msg.type == "schema":
                schema = pa.ipc.read_schema(msg)
            elif msg.type == "record batch":
                if schema is None:
                    raise ValueError("a record batch before the schema")
                if index >= start:
                    end = fh.tell()
                    yield index, pa.ipc.read_record_batch(msg, schema), msg.body, end - msg.body.size
                index += 1
            else:
                raise ValueError(f"unsupported Arrow IPC message {msg.type!r} (dictionary-encoded column?)")
