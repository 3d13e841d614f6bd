"""The docs as a newcomer uses them: every example runs, the site builds, every install hint is right.

* Every ```python and ```bash block of README.md and docs/*.md runs as written, on the sample data
  the set-up makes (``packer.sample.make_dataset``: ``data/images`` + ``data/labels``, as
  ``scripts/demo.sh`` does with ``scripts/make_sample.py``). A page's blocks run in order in one
  fresh working folder (later blocks use the stores earlier ones built), which also holds a link to
  the repository's ``scripts/`` (the docs' commands run from the repository root). Python blocks run
  in a subprocess ``python -``, bash blocks under ``bash -euo pipefail``, each with a timeout, with
  ``python`` and ``packer`` on PATH. Selecting one block (``-k``) runs the earlier blocks of its
  page first.
* An HTML comment on the line right before a fence says what a block needs:
  ``<!-- example: needs=gpu -->`` (also ``mongo``: ``$PACKER_TEST_MONGO_URI``, exported to the block
  as ``$URI``; ``s3``: the S3 test server as ``AWS_ENDPOINT_URL``, with an empty ``my-bucket``;
  ``dask``; ``nvimgcodec``; ``hdf5-tools``; ``torchvision``, whose skip names the
  build that matches the installed torch), ``timeout=SECONDS``, or
  ``skip="reason"`` for the few blocks that cannot run here (the reason is reported). A block whose
  need is absent skips, and fails instead where the matching ``PACKER_REQUIRE_*`` variable is 1.
* ``mkdocs build --strict`` builds the site with no warning (broken links and anchors included).
* Every ``pip install`` hint in the repository names this project's distribution, packer-vision,
  with extras that setup.cfg defines.
"""
from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from packer.sample import make_dataset
from tests import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGS = {"python", "bash"}
DEFAULT_TIMEOUT_S = 240
#: Database the MongoDB examples write to (``mongodb:///datasets/...``): dropped before and after.
MONGO_DOCS_DB = "datasets"

_FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*example:(.*?)-->\s*$")


# ---------------------------------------------------------------------------------------------
# What a block needs
# ---------------------------------------------------------------------------------------------
def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _has_module(name: str):
    def check() -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:   # a missing parent package
            return False
    return check


def _has_torchvision() -> bool:
    from tests.conftest import torchvision_missing

    return torchvision_missing() is None


def _torchvision_what() -> str:
    from tests.conftest import torchvision_missing

    return torchvision_missing() or "torchvision"


#: need -> (check, the variable that makes its absence a failure, what is missing: text, or a
#: function giving it)
NEEDS = {
    "gpu": (_has_cuda, "PACKER_REQUIRE_CUDA", "a CUDA GPU"),
    "mongo": (lambda: bool(os.environ.get("PACKER_TEST_MONGO_URI")), "PACKER_REQUIRE_MONGO",
              "a MongoDB server ($PACKER_TEST_MONGO_URI)"),
    "dask": (_has_module("distributed"), "PACKER_REQUIRE_DASK", "dask.distributed (packer-vision[dask])"),
    "nvimgcodec": (_has_module("nvidia.nvimgcodec"), "PACKER_REQUIRE_NVIMGCODEC",
                   "nvImageCodec (packer-vision[nvimgcodec])"),
    "hdf5-tools": (lambda: shutil.which("h5ls") is not None, "PACKER_REQUIRE_HDF5_TOOLS",
                   "the HDF5 command line tools (h5ls)"),
    # a bucket on the S3 test server (scripts/s3_server.sh): AWS_ENDPOINT_URL and test keys in the
    # block's environment, and an empty bucket named my-bucket, as the docs' examples name it
    "s3": (lambda: bool(os.environ.get("PACKER_TEST_S3_ENDPOINT")) and importlib.util.find_spec("s3fs") is not None,
           "PACKER_REQUIRE_S3", "the S3 test server ($PACKER_TEST_S3_ENDPOINT) and s3fs"),
    # torchvision.transforms.v2 / tv_tensors: the message names the build that matches torch
    "torchvision": (_has_torchvision, "PACKER_REQUIRE_TORCHVISION", _torchvision_what),
}


# ---------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    page: Path
    line: int                   # 1-based line of the opening fence
    lang: str
    code: str
    needs: tuple = ()
    skip: str = ""
    timeout: int = DEFAULT_TIMEOUT_S

    @property
    def where(self) -> str:
        return f"{_rel(self.page)}:{self.line}"


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _parse_directive(text: str, where: str) -> dict:
    out = {}
    for item in shlex.split(text):
        key, sep, value = item.partition("=")
        if not sep or key not in ("needs", "skip", "timeout"):
            raise ValueError(f"{where}: unknown example directive {item!r} "
                             f"(expected needs=a,b / skip=\"reason\" / timeout=SECONDS)")
        if key == "needs":
            names = tuple(n for n in value.split(",") if n)
            unknown = [n for n in names if n not in NEEDS]
            if unknown:
                raise ValueError(f"{where}: unknown need(s) {unknown} (known: {sorted(NEEDS)})")
            out["needs"] = names
        elif key == "skip":
            if not value.strip():
                raise ValueError(f"{where}: skip needs a reason")
            out["skip"] = value
        else:
            out["timeout"] = int(value)
    return out


def parse_blocks(page: Path) -> list[Block]:
    """Fenced blocks at the left margin of ``page``, each with the directive right above it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        if end is None:
            raise ValueError(f"{_rel(page)}:{i + 1}: code fence never closed")
        where = f"{_rel(page)}:{i + 1}"
        d = _DIRECTIVE.match(lines[i - 1]) if i else None
        opts = _parse_directive(d.group(1), where) if d else {}
        if d and m.group(1) not in RUN_LANGS:
            raise ValueError(f"{where}: an example directive above a ```{m.group(1)} block (not run)")
        blocks.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n", **opts))
        i = end + 1
    return blocks


def runnable_blocks() -> list[Block]:
    return [b for page in PAGES for b in parse_blocks(page) if b.lang in RUN_LANGS]


# ---------------------------------------------------------------------------------------------
# Running a page
# ---------------------------------------------------------------------------------------------
@dataclass
class PageRun:
    """One page's working folder; blocks run in page order, each at most once."""
    workdir: Path
    env: dict
    outcomes: dict = field(default_factory=dict)     # block line -> ("ok"|"skip"|"fail", message)
    mongo_clean: bool = False                        # MONGO_DOCS_DB dropped for this page yet
    s3_clean: bool = False                           # S3_DOCS_BUCKET emptied for this page yet

    def run(self, block: Block, blocks: list[Block]):
        absent = self._absent(block)   # a block that cannot run here needs no earlier block
        if absent:
            self.outcomes[block.line] = absent
        for earlier in blocks if not absent else ():
            if earlier.line >= block.line:
                break
            if earlier.line not in self.outcomes:
                self._run(earlier)
            state, msg = self.outcomes[earlier.line]
            if state == "fail":
                pytest.fail(f"{block.where}: an earlier block of the page failed, {earlier.where}:\n{msg}")
        if block.line not in self.outcomes:
            self._run(block)
        state, msg = self.outcomes[block.line]
        if state == "skip":
            pytest.skip(msg)
        if state == "fail":
            pytest.fail(msg, pytrace=False)

    def _run(self, block: Block):
        self.outcomes[block.line] = self._execute(block)

    @staticmethod
    def _absent(block: Block):
        """("skip"|"fail", why) when the block cannot run here, else None."""
        if block.skip:
            return "skip", f"{block.where}: {block.skip}"
        for need in block.needs:
            check, require, what = NEEDS[need]
            if not check():
                what = what() if callable(what) else what
                msg = f"{block.where}: {what if what.startswith('needs ') else 'needs ' + what}"
                if os.environ.get(require) == "1":
                    return "fail", f"{msg}, and {require}=1 says it must be present"
                return "skip", msg
        return None

    def _execute(self, block: Block):
        absent = self._absent(block)
        if absent:
            return absent
        env = dict(self.env)
        if "mongo" in block.needs:
            env["URI"] = os.environ["PACKER_TEST_MONGO_URI"]
            if not self.mongo_clean:   # what another page or run left; later blocks use this one's
                _drop_mongo_docs_db(env["URI"])
                self.mongo_clean = True
        if "s3" in block.needs:
            env.update(AWS_ENDPOINT_URL=os.environ["PACKER_TEST_S3_ENDPOINT"], AWS_ACCESS_KEY_ID="testing",
                       AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
            if not self.s3_clean:      # what another page or run left; later blocks use this one's
                _empty_s3_docs_bucket(env["AWS_ENDPOINT_URL"])
                self.s3_clean = True
        if block.lang == "python":
            cmd, stdin = [sys.executable, "-"], {"input": block.code}
        else:   # -c, stdin closed: a command that reads stdin must not eat the rest of the block
            cmd, stdin = ["bash", "-euo", "pipefail", "-c", block.code], {"stdin": subprocess.DEVNULL}
        try:
            r = subprocess.run(cmd, cwd=self.workdir, env=env, capture_output=True, text=True,
                               timeout=block.timeout, **stdin)
        except subprocess.TimeoutExpired as exc:
            return "fail", (f"{block.where}: ```{block.lang} block ran past {block.timeout} s\n{block.code}"
                            f"--- output so far:\n{_text(exc.stdout)[-3000:]}\n{_text(exc.stderr)[-3000:]}")
        if r.returncode != 0:
            return "fail", (f"{block.where}: ```{block.lang} block exited {r.returncode}\n{block.code}"
                            f"--- stdout:\n{r.stdout[-3000:]}\n--- stderr:\n{r.stderr[-5000:]}")
        return "ok", r.stdout


def _text(b) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


#: The bucket the docs' object-storage examples use (``s3://my-bucket/...``), on the S3 test server.
S3_DOCS_BUCKET = "my-bucket"


def _empty_s3_docs_bucket(endpoint: str):
    import boto3

    s3 = boto3.resource("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")
    bucket = s3.Bucket(S3_DOCS_BUCKET)
    if bucket.creation_date is None:
        bucket.create()
    else:
        bucket.objects.all().delete()


def _drop_mongo_docs_db(uri: str):
    import pymongo

    from packer.stores.mongo.connection import admin_timeout_ms

    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=admin_timeout_ms(10000)) as client:
        client.drop_database(MONGO_DOCS_DB)


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs-sample")
    make_dataset(root / "data", 12, kind="boxes", seed=11)
    return root / "data"


@pytest.fixture(scope="session")
def tool_bin(tmp_path_factory) -> Path:
    """``python``/``python3`` = this interpreter and ``packer`` = its ``-m packer``, first on PATH.

    Scripts, not symbolic links: a virtualenv's interpreter finds its environment from the path
    it was started by, and a link elsewhere would start the base Python without the packages."""
    d = tmp_path_factory.mktemp("docs-bin")
    exe = shlex.quote(sys.executable)
    for name, args in (("python", ""), ("python3", ""), ("packer", " -m packer")):
        (d / name).write_text(f'#!/bin/sh\nexec {exe}{args} "$@"\n')
        (d / name).chmod(0o755)
    return d


@pytest.fixture(scope="session")
def page_runs(tmp_path_factory, sample_data, tool_bin):
    runs = {}
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PATH=f"{tool_bin}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=pythonpath, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")

    def get(page: Path) -> PageRun:
        if page not in runs:
            work = tmp_path_factory.mktemp("docs-" + page.stem.lower())
            shutil.copytree(sample_data, work / "data")
            (work / "scripts").symlink_to(REPO / "scripts")
            runs[page] = PageRun(work, env)
        return runs[page]

    yield get
    if os.environ.get("PACKER_TEST_MONGO_URI") and any(
            "mongo" in b.needs for run_page in runs for b in parse_blocks(run_page)):
        _drop_mongo_docs_db(os.environ["PACKER_TEST_MONGO_URI"])


_BLOCKS = runnable_blocks()


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("block", [
    # marked too, so that `pytest -m torchvision` (check_install.sh's cuda stage) runs them
    pytest.param(b, id=f"{b.page.name}:{b.line}-{b.lang}",
                 marks=[pytest.mark.torchvision] if "torchvision" in b.needs else [])
    for b in _BLOCKS])
def test_example_runs_as_written(block, page_runs):
    page_blocks = [b for b in _BLOCKS if b.page == block.page]
    page_runs(block.page).run(block, page_blocks)


def test_every_page_has_examples_and_few_are_skipped():
    """The docs show working code, and only the handful of set-up and download blocks skip."""
    assert any(b.page.name == "README.md" for b in _BLOCKS)
    skipped = [f"{b.where}: {b.skip}" for b in _BLOCKS if b.skip]
    assert len(skipped) <= 4, "too many examples marked skip:\n" + "\n".join(skipped)


def test_directive_parsing_is_strict(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('<!-- example: needs=gpu,mongo timeout=30 -->\n```python\nprint(1)\n```\n'
                    '<!-- example: skip="downloads" -->\n```bash\nexit 1\n```\n```text\nIMAGES/\n```\n')
    a, b, c = parse_blocks(page)
    assert (a.needs, a.timeout, a.code) == (("gpu", "mongo"), 30, "print(1)\n")
    assert (b.skip, c.lang) == ("downloads", "text")
    page.write_text("<!-- example: needs=gpus -->\n```bash\ntrue\n```\n")
    with pytest.raises(ValueError, match="unknown need"):
        parse_blocks(page)


# ---------------------------------------------------------------------------------------------
# The site
# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_mkdocs_builds_strict_without_warnings(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocs_click") is None:
        pytest.skip("mkdocs / mkdocs-click are not installed (pip install 'packer-vision[dev]')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "WARNING" not in out, out[-5000:]
    cli_page = (tmp_path / "site" / "cli" / "index.html").read_text()
    for command in ("build", "verify", "repair", "convert", "export", "merge", "append", "report"):
        assert f"packer {command}" in cli_page, f"the generated CLI reference lacks 'packer {command}'"


def _slug(heading: str) -> str:
    from markdown.extensions.toc import slugify

    return slugify(re.sub(r"[`*]", "", heading), "-")


def test_readme_and_changelog_links_resolve():
    """Relative links (and their #anchors) of the files outside the site point at what exists."""
    problems = []
    for src in (REPO / "README.md", REPO / "CHANGELOG.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", src.read_text()):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (src.parent / path).resolve() if path else src
            if not dest.exists():
                problems.append(f"{src.name}: link to missing {target}")
            elif anchor and dest.suffix == ".md":
                heads = [_slug(h) for h in re.findall(r"^#+\s+(.*?)\s*$", dest.read_text(), re.M)]
                if anchor not in heads:
                    problems.append(f"{src.name}: no heading #{anchor} in {path}")
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_linked_from_the_index_and_in_the_nav():
    """A page nobody links to is a page nobody reads: docs/index.md's table and mkdocs.yml's nav
    list every docs/*.md, and the README's front door names the dataset formats of other stacks."""
    import yaml

    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "index.md")
    index = (REPO / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)", index))
    unlinked = [p for p in pages if p not in linked]
    assert not unlinked, f"docs/index.md does not link to {unlinked}"

    def nav_files(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from nav_files(v)
        elif isinstance(node, list):
            for v in node:
                yield from nav_files(v)

    nav = set(nav_files(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))
    missing = [p for p in pages + ["index.md"] if p not in nav]
    assert not missing, f"mkdocs.yml's nav lacks {missing}"
    readme = (REPO / "README.md").read_text()
    assert "(docs/interchange.md)" in readme and all(
        name in readme for name in ("WebDataset", "Hugging Face", "MDS", "TFRecord"))


def test_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def test_benchmark_logs_live_in_docs():
    """The raw benchmark logs moved out of the packages; nothing refers to the old places."""
    old = "BENCH_"   # the logs' old names, e.g. readers/gpu/ + old + VS_DALI.md
    assert not list(REPO.glob(f"readers/**/{old}*.md")) and not list(REPO.glob(f"gpu_ops/{old}*.md"))
    logs = sorted(p.name for p in (REPO / "docs" / "benchmarks").glob("*.md"))
    assert {"train_cpu.md", "gpu_pipeline_h100.md", "vs_dali.md", "gpu_ops_h100.md"} <= set(logs), logs
    nav = (REPO / "mkdocs.yml").read_text()
    assert all(f"benchmarks/{name}" in nav for name in logs), "a raw log in docs/benchmarks/ is not in the nav"
    stale = [f"{p.relative_to(REPO)}:{n}" for p in _repo_files(history=False) for n, line in enumerate(_lines(p), 1)
             if re.search(r"(readers|gpu_ops)/(gpu/)?" + old, line)]
    assert not stale, "references to the old benchmark log places: " + ", ".join(stale)


def test_version_names_the_distribution():
    r = subprocess.run([sys.executable, "-m", "packer", "--version"], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.match(r"packer, version \d", r.stdout), r.stdout


# ---------------------------------------------------------------------------------------------
# Install hints
# ---------------------------------------------------------------------------------------------
_SCANNED = {".py", ".md", ".sh", ".cfg", ".toml", ".yml", ".yaml", ".in"}
_SKIP_DIRS = {"build", "dist", "site", "sample", "__pycache__", "node_modules"}
#: Import names of this project: not what pip installs.
_OUR_IMPORT_NAMES = {"packer", "readers", "gpu_ops", "gpu-ops", "packer_vision"}


def _repo_files(history: bool = False):
    """The repository's text files that the scans read; CHANGELOG.md (the record of what the old
    names and places were) only with ``history=True``."""
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames
                       if not d.startswith(".") and d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        for name in filenames:
            path = Path(dirpath) / name
            if path.suffix in _SCANNED and (history or path != REPO / "CHANGELOG.md"):
                yield path


def _lines(path: Path):
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return []


def setup_cfg_extras() -> set:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return set(cfg["options.extras_require"])


def install_hint_problems(line: str, extras: set) -> list:
    """What is wrong with the install hints in one line of text (empty: nothing)."""
    problems = []
    # `packer[report]` and the like, anywhere: the distribution is packer-vision.
    for m in re.finditer(r"(?<![\w.-])(packer|packer_vision)\[([^\]]*)\]", line):
        problems.append(f"{m.group(0)} names another project: the distribution is packer-vision[{m.group(2)}]")
    # Extras of packer-vision, and of a checkout's '.' on a pip line: every one must exist.
    local = r"|(?<![\w/])\.(?=\[)" if "pip" in line else ""
    for m in re.finditer(r"(?:(?<![\w-])packer-vision" + local + r")\[([^\]]*)\]", line):
        for extra in (e.strip() for e in m.group(1).split(",")):
            if extra not in extras:
                problems.append(f"{m.group(0)}: no extra {extra!r} in setup.cfg (known: {sorted(extras)})")
    # `pip install packer` / `pip install readers`: other projects' names on PyPI.
    for m in re.finditer(r"pip3? install((?:\s+[^\s;&|#)`]+)+)", line):
        for token in m.group(1).split():
            name = re.split(r"[\[<>=!~]", token.strip("'\""), maxsplit=1)[0]
            if name in _OUR_IMPORT_NAMES:
                problems.append(f"'pip install {token}' installs another project: use packer-vision")
    return problems


def test_install_hint_checker_catches_wrong_names():
    extras = {"report", "dask", "gpu", "mongo", "dev"}
    pip = "pip" + " install"   # keeps this file's own lines out of the scan below
    assert install_hint_problems(f"{pip} 'packer-vision[report]'", extras) == []
    assert install_hint_problems(f"{pip} -e .[dev,mongo] && {pip} h5py 'dask[distributed]'", extras) == []
    assert install_hint_problems('re.compile(r"[^"\\\\]*"), x.[0]', extras) == []   # code, not a hint
    for bad in (f"{pip} 'packer" + "[report]'", f"({pip} 'packer-vision[plots]')", f"{pip} packer",
                f"{pip} -e ." + "[dev,docs]", "the optional extra ``packer" + "[gpu]``"):
        assert install_hint_problems(bad, extras), bad


def test_every_install_hint_names_packer_vision():
    """Every .py/.md/.sh/.cfg (and .toml/.yml/.in) file but this one, whose strings are the
    patterns (test_install_hint_checker_catches_wrong_names checks the checker)."""
    extras = setup_cfg_extras()
    problems = [f"{path.relative_to(REPO)}:{n}: {msg}"
                for path in _repo_files() if path != Path(__file__).resolve()
                for n, line in enumerate(_lines(path), 1)
                for msg in install_hint_problems(line, extras)]
    assert not problems, "\n".join(problems)
