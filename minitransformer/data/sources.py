"""Where prepared text comes from: the files ``--data`` names, each read as documents.

    bundled names, files, folders (every file under them, sorted, but hidden files and the
    model, run and prepared folders inside them: ``folder_files``), globs, and folders written
    by ``datasets``' ``save_to_disk`` (their Arrow files, in row order)
    a text file is one document; JSON Lines one per line (its text field): ``.jsonl`` and
    ``.ndjson`` files, and a ``.json`` file whose first line is a whole JSON object (what
    ``datasets``' ``to_json`` writes); a ``.parquet`` or ``.arrow`` file one per row (its text
    column: tables.py)

Every document carries where it came from (``file`` or ``file:line``) for messages, and each
source file a fingerprint (absolute path, size, SHA-256) to notice a moved or changed source.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .shards import MANIFEST, PARTIAL, TOKENS
from .tables import (
    NULL_HINT,
    arrow_rows,
    dataset_files,
    is_dataset_folder,
    note_dropped,
    parquet_rows,
)
from .text import (
    BUNDLED,
    corpus_path,
    looks_binary,
    refuse_binary,
    refuse_compressed,
    wide_encoding,
)

TABLES = {".parquet": parquet_rows, ".arrow": arrow_rows}  # suffix -> rows of (text, where)


@dataclass
class Document:
    """One document of a source: its text and where it came from (for messages)."""

    text: str
    where: str


def refuse_non_text_folder(path: Path) -> None:
    """A folder of our own making given as text: say what it is, not that its first file is
    binary (tokens.bin, model.safetensors)."""
    if (path / MANIFEST).is_file():
        raise UserError(f"{path} is prepared data already: train reads it as it is (--data "
                        f"{path}), alone; prepare reads text")
    if (path / TOKENS).is_file():
        raise UserError(f"{path} holds prepared token ids ({TOKENS}) without its {MANIFEST}: a "
                        f"prepare that did not finish, or a damaged prepared folder; prepare "
                        f"the text again (a complete prepared folder is read with --data "
                        f"{path})")
    if (path / "checkpoints").is_dir() or (path / "trainer_state.json").is_file():
        raise UserError(f"{path} is a training run (or a checkpoint), not text: give --data "
                        f"the text it was trained on")


def repository_files(folder: Path, found: list[Path]) -> tuple[list[Path], str | None]:
    """(the files to read, a note or None) of a folder laid out as a Hugging Face dataset
    repository: where it holds Parquet files, they are the data and its other files
    (README.md, LICENSE) describe it; where their names or folders name splits
    (data/train-00000-of-00001.parquet, test-..., validation/...), the train split alone is
    the training text. A repository: a README.md that opens with YAML front matter (a dataset
    card) or a .gitattributes file. Any other folder: all its files, no note."""
    tables = [p for p in found if p.suffix.lower() == ".parquet"]
    if not tables or not _is_repository(folder):
        return found, None
    splits = {p: _split_of(p.relative_to(folder)) for p in tables}
    train = [p for p in tables if splits[p] == "train"]
    kept = train if train and len(train) < len(tables) else tables
    left = [p for p in found if p not in kept]
    if not left:
        return found, None
    which = "its train split's " if kept is train else ""
    shown = ", ".join(str(p.relative_to(folder)) for p in left[:4])
    return kept, (f"note: {folder} reads as a dataset repository: {which}{len(kept)} Parquet "
                  f"file(s); left out {len(left)} other file(s): {shown}"
                  f"{' ...' if len(left) > 4 else ''} (name files or a glob to read others)")


SPLITS = ("train", "validation", "valid", "test", "dev", "eval")


def _is_repository(folder: Path) -> bool:
    """Whether ``folder`` looks cloned from the Hugging Face Hub (see ``repository_files``)."""
    if (folder / ".gitattributes").is_file():
        return True
    try:
        with open(folder / "README.md", "rb") as f:
            return f.readline(64).strip() == b"---"
    except OSError:
        return False


def _split_of(relative: Path) -> str | None:
    """The split a Parquet file's path names (train-0000-of-0001.parquet, train/0.parquet)."""
    for part in relative.parts:
        head = re.split(r"[-_.]", part.lower(), maxsplit=1)[0]
        if head in SPLITS:
            return head
    return None


def source_files(sources: list[str], echo=None) -> list[Path]:
    """Files named by --data: bundled names, files, folders (their files, sorted; a
    save_to_disk folder: its Arrow files; a dataset repository: ``repository_files``),
    globs. ``echo`` says what a folder's files left out, where given."""
    files: list[Path] = []
    for source in sources:
        if source in BUNDLED:
            files.append(corpus_path(source))
            continue
        path = Path(source)
        if is_dataset_folder(path):
            files += dataset_files(path)
        elif path.is_dir():
            refuse_non_text_folder(path)
            found = folder_files(path)
            if not found and (path / PARTIAL).is_dir():
                raise UserError(f"{source} holds only an unfinished prepare ({PARTIAL}/, which "
                                f"is never read): run that prepare again to finish it, or give "
                                f"--data the text it was preparing")
            if not found:
                raise UserError(f"{source} is an empty folder: no files to read")
            found, note = repository_files(path, found)
            if note and echo is not None:
                echo(note)
            files += found
        elif any(ch in source for ch in "*?["):
            found = sorted(Path().glob(source)) if not path.is_absolute() else \
                sorted(Path(path.anchor).glob(str(path.relative_to(path.anchor))))
            if not found:
                raise UserError(f"--data {source}: the pattern matches no file")
            files += [p for p in found if p.is_file()]
        else:
            files.append(corpus_path(source))  # a missing file is a UserError there
    seen: dict[Path, Path] = {}
    for path in files:  # twice in the text, a file would be in both splits
        if (key := path.resolve()) in seen:
            raise UserError(f"--data reads {path} twice (a source given twice, a file and a "
                            f"folder or glob that holds it, or a link to it): give each file "
                            f"once")
        seen[key] = path
    if len(files) > 1 and all(_blank(p) for p in files):  # one alone: load_text says so
        raise UserError(f"every file of --data is empty (or only whitespace): "
                        f"{', '.join(str(p) for p in files[:3])}{' ...' * (len(files) > 3)}")
    return files


def _blank(path: Path, limit: int = 1 << 16) -> bool:
    """Whether a file holds nothing but whitespace (a larger one than ``limit`` never is)."""
    try:
        size = path.stat().st_size
        return size == 0 or (size <= limit and not path.read_bytes().strip())
    except OSError:  # said when it is read
        return False


def folder_files(folder: Path) -> list[Path]:
    """The files under ``folder``, sorted by path: not hidden ones (a name starting with "."
    at any depth: ``.git/``, ``.cache/``), and nothing under a folder that holds a model or
    prepared data (``is_model_folder``), such as a run trained with ``--out`` inside the
    folder it read: its checkpoints are not text, and its files would change what the folder
    holds from one run to the next."""
    found = []
    for root, dirs, names in os.walk(folder):
        here = Path(root)
        dirs[:] = [d for d in dirs if not d.startswith(".") and not is_model_folder(here / d)]
        found += [here / n for n in names if not n.startswith(".") and (here / n).is_file()]
    return sorted(found)


def is_model_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a training run (``checkpoints/step_*``), a saved model
    (``config.json`` beside ``model.safetensors``), ``prepare``'s output (``manifest.json``
    beside ``tokens.bin``) or ``compare``'s (``results.json`` beside ``compare.png``)."""
    def both(a: str, b: str) -> bool:
        return (folder / a).is_file() and (folder / b).is_file()

    return both("config.json", "model.safetensors") or both("manifest.json", "tokens.bin") \
        or both("results.json", "compare.png") or any((folder / "checkpoints").glob("step_*"))


JSON_LINES = (".jsonl", ".ndjson")  # JSON Lines by name; a .json file by its first line


def is_json_lines(path: Path) -> bool:
    """Whether ``path`` is JSON Lines: a .jsonl or .ndjson file, or a .json file whose first
    line is a whole JSON object (``Dataset.to_json`` writes JSON Lines to .json by default).
    Any other .json file (one document spread over lines) is read as one text."""
    suffix = path.suffix.lower()
    if suffix in JSON_LINES:
        return True
    if suffix != ".json":
        return False
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
        return isinstance(json.loads(first.decode("utf-8-sig")), dict)
    except (OSError, ValueError):  # unreadable (said later), or not one object a line
        return False


def has_records(path: Path) -> bool:
    """Whether ``path`` holds records (JSON Lines, table rows) whose text is a field."""
    return path.suffix.lower() in TABLES or is_json_lines(path)


def check_text_field(files: list[Path], text_field: str) -> None:
    """A field other than "text" asked of sources without records (plain text, read whole):
    a UserError, not a flag silently ignored."""
    if text_field != "text" and not any(has_records(p) for p in files):
        for path in files:
            refuse_compressed(path)
        raise UserError(f"--text_field {text_field} names the text of JSONL records and "
                        f"Parquet/Arrow rows; {', '.join(p.name for p in files[:3])} "
                        f"{'is' if len(files) == 1 else 'are'} plain text, read whole: drop it")


def read_documents(files: list[Path], text_field: str = "text", encoding: str = "utf-8",
                   errors: str = "strict") -> Iterator[Document]:
    """Each file's documents: a text file is one; JSON Lines one per line (``is_json_lines``),
    a .parquet or .arrow file one per row (the ``text_field`` of each). ``errors`` "skip"
    also leaves out records and rows whose text is null."""
    for path in files:
        suffix = path.suffix.lower()
        if is_json_lines(path):
            yield from _jsonl(path, text_field, encoding, errors)
            continue
        if suffix in TABLES:
            for text, where in TABLES[suffix](path, text_field, errors == "skip"):
                yield Document(text, where)
            continue
        try:
            raw = path.read_bytes()
            if not wide_encoding(encoding):
                if errors == "skip" and looks_binary(raw):
                    continue
                refuse_binary(path, raw)  # --errors replace would make text of an image
            text = raw.decode(encoding, errors="replace" if errors == "replace" else "strict")
        except OSError as e:
            raise UserError(f"cannot read {path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            if errors == "skip":
                continue
            raise UserError(f"{path}: not valid {encoding} at byte {e.start}; pass --encoding, "
                            f"or --errors replace|skip") from None
        yield Document(text.removeprefix("\ufeff"), str(path))


def decodes(path: Path, encoding: str) -> bool:
    """Whether the whole of ``path`` decodes (``--errors skip`` leaves it out otherwise)."""
    try:
        decoder = codecs.getincrementaldecoder(encoding)("strict")
    except LookupError:
        raise UserError(f"unknown encoding {encoding!r}") from None
    try:
        with open(path, "rb") as f:
            while raw := f.read(1 << 20):
                decoder.decode(raw)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    return True


def _jsonl(path: Path, field: str, encoding: str, errors: str) -> Iterator[Document]:
    """The records of a JSON Lines file. Bytes that do not decode are found line by line
    (read as lone surrogates, which decoded text never holds), so that the line is named
    (``file:line``) or, under --errors skip, left out alone as a record without its text is.
    In UTF-16 and UTF-32 such bytes may not be found so: then the file is named, and skip
    leaves it out whole."""
    if wide_encoding(encoding) and errors == "skip" and not decodes(path, encoding):
        return
    try:
        f = open(path, encoding=encoding,
                 errors="replace" if errors == "replace" else "surrogateescape")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    with f:
        try:
            yield from _jsonl_records(_decoded_lines(f, path, encoding, errors), path, field,
                                      errors)
        except UnicodeDecodeError:
            raise UserError(f"{path}: not valid {encoding}; pass --encoding, or --errors "
                            f"replace|skip") from None


_UNDECODED = re.compile("[\udc80-\udcff]")  # a byte surrogateescape could not decode


def _decoded_lines(f, path: Path, encoding: str, errors: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line that decodes; one that does not is a UserError
    naming it, or under --errors skip left out."""
    for lineno, line in enumerate(f, 1):
        bad = _UNDECODED.search(line)
        if bad is None:
            yield lineno, line
        elif errors != "skip":
            raise UserError(f"{path}:{lineno}: not valid {encoding} at character "
                            f"{bad.start() + 1} of the line; pass --encoding, or --errors "
                            f"replace|skip")
        else:
            note_dropped()


def _jsonl_records(lines, path: Path, field: str, errors: str) -> Iterator[Document]:
    for lineno, line in lines:
        if lineno == 1:
            line = line.removeprefix("\ufeff")  # a byte order mark, as for .txt files
        if not line.strip():
            continue
        try:
            yield Document(_record_text(line, field), f"{path}:{lineno}")
        except UserError as e:
            if errors != "skip":  # skip: a record without its text is left out
                raise UserError(f"{path}:{lineno}: {e}") from None
            note_dropped()


def _record_text(line: str, field: str) -> str:
    """The text of one JSON Lines record; a UserError says what is wrong with it."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise UserError(f"not valid JSON ({e}); {NULL_HINT}") from None
    if not isinstance(record, dict):
        raise UserError(f"not a JSON object; {NULL_HINT}")
    if field not in record:
        fields = ", ".join(record) or "none"
        raise UserError(f"no text field {field!r}; its fields are {fields} (--text_field NAME "
                        f"reads another; {NULL_HINT})")
    if record[field] is None:
        raise UserError(f"field {field!r} is null; {NULL_HINT}")
    if not isinstance(record[field], str):
        raise UserError(f"field {field!r} holds {type(record[field]).__name__}, not text; "
                        f"{NULL_HINT}")
    return record[field]


def fingerprint(files: list[Path]) -> list[dict]:
    """Each source's absolute path, size and SHA-256 (to notice a moved or changed source)."""
    out = []
    for path in files:
        digest = hashlib.sha256()
        try:  # a folder's file may go between its listing and here (a log, a temporary file)
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            size = path.stat().st_size
        except OSError as e:
            raise UserError(f"cannot read {path}: {e.strerror}") from None
        out.append({"path": str(path.resolve()), "bytes": size, "sha256": digest.hexdigest()})
    return out
