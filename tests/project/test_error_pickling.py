"""Every exception class of packer, readers and gpu_ops crosses a process boundary intact.

DataLoader workers, build workers and dask hand errors to the parent by pickling them, and
PyTorch's DataLoader re-raises a worker's error as ``type(exc)(message)`` (torch/_utils.py,
ExceptionWrapper.reraise): a class that unpickles wrong, or cannot be made from one message,
reaches the user as another error (``RuntimeError('Caught RecordError in DataLoader worker')``).
The classes are found by walking the packages, so a new one is covered without listing it.
"""
from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

PACKAGES = ("packer", "readers", "gpu_ops")


def _walk():
    classes, unimportable = {}, []
    for pkg in PACKAGES:
        root = importlib.import_module(pkg)
        names = [pkg] + [info.name for info in pkgutil.walk_packages(root.__path__, pkg + ".")]
        for name in names:
            try:
                module = importlib.import_module(name)
            except ImportError as exc:   # an optional dependency missing here
                unimportable.append((name, f"{type(exc).__name__}: {exc}"))
                continue
            for obj in vars(module).values():
                if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == name:
                    classes[f"{name}.{obj.__qualname__}"] = obj
    return classes, unimportable


CLASSES, UNIMPORTABLE = _walk()


def _sample(name: str, annotation) -> object:
    """A value for parameter ``name`` that its annotation (a string: postponed) accepts."""
    text = str(annotation)
    if "dict" in text:
        return {"host": "build-01", "pid": 4242}
    if "list" in text:
        return ["a.jpg: line 3: bad class id", "b.jpg: no label"]
    if "int" in text and "str" not in text:
        return 7
    return f"<{name}>"


def make(cls) -> BaseException:
    """An instance of ``cls`` with every parameter of its ``__init__`` given a value."""
    args, kwargs = [], {}
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            args.append("something went wrong: x.jpg")
        elif p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = _sample(p.name, p.annotation)
        elif p.kind is not p.VAR_KEYWORD:
            args.append(_sample(p.name, p.annotation))
    return cls(*args, **kwargs)


def test_the_walk_finds_the_classes():
    """The walk sees the classes it is meant to cover (and so would see a new one); a module
    that does not import here (an optional dependency missing) is named in the skip."""
    for name in ("packer.core.errors.RecordError", "packer.core.errors.DiskFullError", "packer.core.errors.LockedError",
                 "readers.gpu.decoders.DecodeError", "gpu_ops.build.BuildError"):
        if name.startswith("readers.gpu") and any(m.startswith("readers.gpu") for m, _ in UNIMPORTABLE):
            continue
        assert name in CLASSES, sorted(CLASSES)
    if UNIMPORTABLE:
        pytest.skip(f"not checked, they do not import here: {UNIMPORTABLE}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_pickle_round_trip_keeps_message_and_fields(name):
    exc = make(CLASSES[name])
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert back.args == exc.args
    assert vars(back) == vars(exc)   # every field (key, index, problems, holder, needed...)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_dataloader_reraise_keeps_the_class(name):
    """As a DataLoader worker's error reaches the main process: the same class, not RuntimeError."""
    torch_utils = pytest.importorskip("torch._utils")
    cls = CLASSES[name]
    try:
        raise make(cls)
    except BaseException:   # noqa: BLE001 - wrapped as DataLoader wraps whatever a worker raises
        wrapped = torch_utils.ExceptionWrapper(where="in DataLoader worker process 1")
    with pytest.raises(BaseException) as info:
        wrapped.reraise()
    assert type(info.value) is cls, f"{cls.__name__} arrived as {type(info.value).__name__}: {info.value}"
    assert "in DataLoader worker process 1" in str(info.value)


@pytest.mark.timeout(60)
def test_record_error_from_a_worker_message_keeps_its_fields():
    from packer.core.errors import RecordError

    exc = RecordError("/data/train.lmdb", "cat's/img 7.jpg", "checksum mismatch: bytes changed", 7)
    torch_utils = pytest.importorskip("torch._utils")
    try:
        raise exc
    except RecordError:
        wrapped = torch_utils.ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(RecordError) as info:
        wrapped.reraise()
    got = info.value
    assert (got.store, got.key, got.index, got.reason) == (exc.store, exc.key, exc.index, exc.reason)


@pytest.mark.timeout(180)
def test_damaged_record_through_two_worker_dataloader_raises_record_error(tmp_path):
    """End to end: a record damaged on disk, read by DataLoader(num_workers=2), arrives as the
    RecordError the README promises, naming its key and index."""
    torch_data = pytest.importorskip("torch.utils.data")
    from packer import build
    from packer.core.errors import RecordError
    from packer.sample import make_dataset
    from packer.stores import open_store
    from readers import StoreDataset
    from tests.corpus import cut_lmdb_record

    images, _ = make_dataset(tmp_path / "src", 12, kind="classes", seed=3)
    store = str(tmp_path / "train.lmdb")
    assert build(images, None, store, workers=1).published
    bad = 9
    with open_store(store) as reader:
        bad_key = reader.get(bad).key
    cut_lmdb_record(store, bad)

    loader = torch_data.DataLoader(StoreDataset(store), batch_size=2, num_workers=2, collate_fn=list)
    with pytest.raises(RecordError) as info:
        for _ in loader:
            pass
    assert info.value.key == bad_key
    assert info.value.index == bad
    assert "DataLoader worker" in str(info.value)
