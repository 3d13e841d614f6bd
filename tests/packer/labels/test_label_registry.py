"""The label form registry (:mod:`packer.labels`): a form is one module ending in one ``FORM``
record plus one entry in the registry's module list, and detection, parsing, the build, export and
the CLI's ``--labels-format`` choices all pick it up from there.

The toy form below lives only in this file: nothing else in packer is touched to add it.
"""
from __future__ import annotations

import csv
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import packer
import packer.labels as labels
from packer.labels.base import LabelForm, LabelWriter
from packer.labels.export import get_label_writer, infer_label_form, label_writers
from packer.sample import make_dataset
from packer.sources.folders import collect_sources

# A toy form: LABELS is a ``.toy`` file of ``path<TAB>class name`` lines.
TOY_MODULE = '''
from pathlib import Path

from packer.core.errors import UsageError
from packer.labels.base import LabelForm, ParsedLabels, RecordsWriter


def _detect(path):
    path = Path(path)
    return path.is_file() and path.suffix == ".toy"


def _parse(labels, root, keys, options):
    if not labels.is_file():
        raise UsageError(f"{labels}: --labels-format toy expects a .toy file")
    mapping, problems = {}, []
    for n, line in enumerate(labels.read_text(encoding="utf-8").splitlines(), 1):
        key, _, name = line.partition("\\t")
        if key in keys:
            mapping[key] = name
        else:
            problems.append(f"{labels}:{n}: no image {key!r}")
    return ParsedLabels(mapping, problems, "class", str(labels), label_info={"format": "toy"})


def write_toy(records, class_names, out, label_info=None):
    Path(out).write_text("".join(f"{r.key}\\t{class_names[r.label]}\\n" for r in records), encoding="utf-8")


class ToyWriter(RecordsWriter):
    name = "toy"
    target = "labels.toy"
    write = staticmethod(write_toy)


FORM = LabelForm("toy", detect=_detect, order=5, parse=_parse, write=write_toy, exports=(ToyWriter,),
                 schemas=("class",), choices=("toy",))
'''


def _toy_module() -> types.ModuleType:
    mod = types.ModuleType("toy_label_form")
    exec(compile(TOY_MODULE, "toy_label_form.py", "exec"), mod.__dict__)
    return mod


@pytest.fixture
def toy(monkeypatch):
    """The toy form, registered by adding its module to the registry's list (and nothing else)."""
    mod = _toy_module()
    monkeypatch.setattr(labels, "_MODULES", (*labels._MODULES, mod))
    return mod


@pytest.fixture(scope="module")
def toy_dataset(tmp_path_factory) -> tuple[Path, Path, dict]:
    """Flat images and the same labels as a ``.toy`` file: (IMAGES, LABELS, {key: class name})."""
    images, csv_file = make_dataset(tmp_path_factory.mktemp("toy"), 6, kind="csv", sizes=((40, 56),), seed=7)
    with open(csv_file, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[1:]
    want = {path: name for path, name in rows}
    toy_file = csv_file.with_suffix(".toy")
    toy_file.write_text("".join(f"{k}\t{v}\n" for k, v in want.items()), encoding="utf-8")
    return images, toy_file, want


def test_a_registered_form_is_detected_parsed_built_and_exported(toy, toy_dataset, tmp_path):
    images, toy_file, want = toy_dataset
    assert "toy" in labels.available_label_forms() and "toy" in labels.label_format_choices()
    assert labels.get_label_form("toy") is toy.FORM
    assert labels.detect_format(toy_file) == "toy"
    assert get_label_writer("toy") is toy.ToyWriter and "toy" in label_writers()

    src = collect_sources(images, toy_file)   # auto: detection, then the form's parser
    names = sorted(set(want.values()))
    assert src.class_names == names and src.label_info == {"format": "toy"}
    assert {k: names[c] for k, c in zip(src.keys, src.labels)} == want

    store = tmp_path / "toy.lmdb"
    packer.build(images, toy_file, store, labels_format="toy", workers=1)
    out = tmp_path / "exported"
    rep = packer.export(store, out, labels_form="toy")
    assert rep.labels == str(out / "labels.toy") and rep.label_form == "toy"
    assert sorted((out / "labels.toy").read_text(encoding="utf-8").splitlines()) == sorted(toy_file.read_text(
        encoding="utf-8").splitlines())
    again = collect_sources(out / "images", out / "labels.toy")
    assert again.keys == src.keys and again.labels == src.labels


def test_without_its_registry_line_the_form_is_unknown(toy_dataset):
    """The module list is what makes a form known: without the entry nothing knows ``toy``."""
    images, toy_file, _ = toy_dataset
    assert "toy" not in labels.label_format_choices() and "toy" not in label_writers()
    with pytest.raises(packer.UsageError, match="unknown labels format 'toy'"):
        labels.get_label_form("toy")
    with pytest.raises(packer.UsageError, match="LABELS must be a folder"):
        collect_sources(images, toy_file)


def test_detection_follows_the_order_the_records_declare(toy, monkeypatch, tmp_path):
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text("path,label\n", encoding="utf-8")
    assert labels.detect_format(csv_file) == "csv"
    greedy = LabelForm("greedy", detect=lambda p: True, order=labels.get_label_form("csv").order + 1)
    monkeypatch.setattr(labels, "_MODULES", (*labels._MODULES, types.SimpleNamespace(FORM=greedy)))
    assert labels.detect_format(csv_file) == "csv"          # csv is asked first
    assert labels.detect_format(tmp_path / "x.toy") == "greedy"   # not a file: toy says no
    first = LabelForm("first", detect=lambda p: True, order=-1)
    monkeypatch.setattr(labels, "_MODULES", (*labels._MODULES, types.SimpleNamespace(FORM=first)))
    assert labels.detect_format(csv_file) == "first"


def test_the_cli_choices_come_from_the_registry(toy_dataset, tmp_path):
    """``packer build --labels-format toy`` in a fresh interpreter whose registry lists the toy
    module: the click choices are read from the registry when the CLI is built."""
    images, toy_file, _ = toy_dataset
    (tmp_path / "toy_label_form.py").write_text(TOY_MODULE, encoding="utf-8")
    driver = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import toy_label_form
        import packer.labels
        packer.labels._MODULES = (*packer.labels._MODULES, toy_label_form)
        from packer.cli import cli
        cli(sys.argv[1:])
    """)

    def run(*args):
        return subprocess.run([sys.executable, "-c", driver, *args], capture_output=True, text=True, timeout=300,
                              cwd=Path(packer.__file__).parents[1])

    help_text = run("build", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert re.search(r"\[auto\|coco\|voc\|yolo\|csv\|masks\|toy\]", re.sub(r"\s+", "", help_text.stdout))
    out = tmp_path / "cli.lmdb"
    r = run("build", str(images), str(toy_file), "-o", str(out), "--labels-format", "toy", "-j", "1", "-q")
    assert r.returncode == 0, r.stderr
    with packer.open_store(str(out)) as reader:
        assert reader.metadata.label_info == {"format": "toy"}


def test_every_form_module_is_in_the_registry():
    """A module of packer/labels/ that ends in a ``FORM`` but is missing from the list would be
    silently unknown; and two forms offering one export name would hide one of them."""
    folder = Path(labels.__file__).parent
    defining = {p.stem for p in folder.glob("*.py") if re.search(r"^FORM = LabelForm\(", p.read_text(), re.M)}
    assert defining == {m.__name__.rsplit(".", 1)[-1] for m in labels._MODULES}
    names = [cls.name for f in labels.label_forms() for cls in f.exports]
    assert len(names) == len(set(names)) and all(names)
    assert sorted(label_writers()) == sorted(["none", *names])
    for form in labels.label_forms():
        assert all(isinstance(cls, type) and issubclass(cls, LabelWriter) for cls in form.exports)
        assert form.per_image == (form.parse_file is not None)


def test_objects_stores_export_in_the_form_they_came_from():
    """infer_label_form's "objects" forms come from the records' schemas."""
    meta = types.SimpleNamespace(build_options={"labels": "x"}, label_schema="objects", label_info={})
    for name in ("coco", "voc", "masks", "yolo"):
        meta.label_info = {"format": name}
        assert infer_label_form(meta) == name
    meta.label_info = {"format": "csv"}
    assert infer_label_form(meta) == "coco"


def test_a_folder_of_per_image_files_mixes_yolo_and_json(tmp_path):
    """--labels-format yolo on a folder reads every per-image form's files (as before the registry)."""
    images, _ = make_dataset(tmp_path / "ds", 2, kind="csv", sizes=((40, 56),), seed=3)
    keys = sorted(p.name for p in images.iterdir())
    lab = tmp_path / "labels"
    lab.mkdir()
    (lab / Path(keys[0]).with_suffix(".txt").name).write_text("0 0.5 0.5 0.2 0.2\n", encoding="utf-8")
    (lab / Path(keys[1]).with_suffix(".json").name).write_text('{"boxes": [[1, 0.5, 0.5, 0.1, 0.1]]}',
                                                              encoding="utf-8")
    assert labels.detect_format(lab) == "yolo"
    parsed = labels.parse_labels("yolo", lab, images, keys)
    assert sorted(parsed.mapping) == keys and not parsed.problems
    assert labels.parse_labels("json", lab, images, keys).mapping.keys() == parsed.mapping.keys()
