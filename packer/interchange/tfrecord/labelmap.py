"""Class names of TFRecord data: the TF OD API's ``label_map.pbtxt`` (read and written), and the
id <-> name bindings the label map and the records give."""
from __future__ import annotations

from dataclasses import dataclass, field

from packer.core import remote
from packer.core.errors import UsageError
from packer.labels.limits import MAX_PER_IMAGE_BYTES

LABEL_MAP = "label_map.pbtxt"


def placeholder(class_id: int) -> str:
    """The class name given to an id that the data uses or skips but never names."""
    return f"__unused_{class_id}__"


def _label_map_classes():
    """Message classes of the TF OD API's StringIntLabelMap (the fields packer reads)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(name="packer_string_int_label_map.proto",
                                            package="object_detection.protos", syntax="proto2")
    item = fd.message_type.add(name="StringIntLabelMapItem")
    opt, lab = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto
    for name, number, typ in (("name", 1, lab.TYPE_STRING), ("id", 2, lab.TYPE_INT32),
                              ("display_name", 3, lab.TYPE_STRING)):
        item.field.add(name=name, number=number, type=typ, label=opt)
    top = fd.message_type.add(name="StringIntLabelMap")
    top.field.add(name="item", number=1, type=lab.TYPE_MESSAGE, label=lab.LABEL_REPEATED,
                  type_name=".object_detection.protos.StringIntLabelMapItem")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    desc = pool.FindMessageTypeByName("object_detection.protos.StringIntLabelMap")
    get = getattr(message_factory, "GetMessageClass", None)
    return get(desc) if get else message_factory.MessageFactory(pool).GetPrototype(desc)


def read_label_map(path: str, storage_options=None) -> dict:
    """``{id: name}`` of a ``label_map.pbtxt`` (``display_name`` where given, else ``name``).

    Raises:
        UsageError: the file is not a label map, or gives one id or one name twice.
    """
    from google.protobuf import text_format

    msg = _label_map_classes()()
    try:
        if remote.is_url(path):   # beside TFRecord objects in a bucket: a small file, read whole (bounded)
            info = remote.stat(path, storage_options)
            if info.size > MAX_PER_IMAGE_BYTES:
                raise ValueError(f"{info.size} bytes, more than a label map may hold ({MAX_PER_IMAGE_BYTES})")
            text = remote.read(path, 0, info.size, version=info.version, storage_options=storage_options).decode()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        text_format.Parse(text, msg, allow_unknown_field=True)
    except (OSError, ValueError, text_format.ParseError) as exc:
        raise UsageError(f"{path}: not a readable TF OD label map: {exc}") from exc
    out, seen = {}, {}
    for item in msg.item:
        name = item.display_name or item.name
        if not item.HasField("id") or not name or item.id < 0:
            raise UsageError(f"{path}: an item without a non-negative id and a name ({item.id}, {name!r})")
        if item.id in out or name in seen:
            raise UsageError(f"{path}: id {item.id} or name {name!r} appears twice")
        out[item.id], seen[name] = name, item.id
    return out


def write_label_map(path: str, class_names: list) -> int:
    """Write ``label_map.pbtxt`` with an item per named id (placeholders left out); returns the count."""
    from google.protobuf import text_format

    msg = _label_map_classes()()
    for i, name in enumerate(class_names):
        if name != placeholder(i):
            msg.item.add(name=name, id=i)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text_format.MessageToString(msg, as_utf8=True))
    return len(msg.item)


@dataclass
class Names:
    """Class id <-> name as the label map and the records give them; conflicts refuse a record."""

    by_id: dict = field(default_factory=dict)
    by_name: dict = field(default_factory=dict)
    pending: set = field(default_factory=set)   # names seen without an id

    def bind(self, pairs) -> None:
        """Check then record ``(id or None, name or None)`` pairs of one record (ValueError: a clash)."""
        new_ids, new_names = {}, {}
        for cid, name in pairs:
            if cid is not None and cid < 0:
                raise ValueError(f"class id {cid} is negative")
            if cid is None or name is None:
                continue
            known = self.by_id.get(cid, new_ids.get(cid))
            if known is not None and known != name:
                raise ValueError(f"class {cid} is named {name!r} here but {known!r} before")
            other = self.by_name.get(name, new_names.get(name))
            if other is not None and other != cid:
                raise ValueError(f"class name {name!r} has id {cid} here but {other} before")
            new_ids[cid], new_names[name] = name, cid
        self.by_id.update(new_ids)
        self.by_name.update(new_names)
        self.pending.update(n for c, n in pairs if c is None and n is not None and n not in self.by_name)

    def resolve(self) -> None:
        """Give each name seen without an id the next free id, in sorted order."""
        nxt = max(self.by_id, default=-1) + 1
        for name in sorted(self.pending - set(self.by_name)):
            self.by_id[nxt], self.by_name[name] = name, nxt
            nxt += 1

    def class_names(self, used_max: int) -> list:
        if not self.by_id:
            return []
        top = max(max(self.by_id), used_max)
        return [self.by_id.get(i, placeholder(i)) for i in range(top + 1)]
