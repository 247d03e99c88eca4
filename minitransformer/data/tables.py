"""Columnar sources, read through ``pyarrow``: one document per row, the text in one column.

    file.parquet             read a row group at a time (only the text column)
    a save_to_disk folder    what ``datasets``' ``Dataset.save_to_disk`` writes: Arrow stream
                             files (``data-00000-of-00003.arrow`` ...) listed in ``state.json``
                             beside ``dataset_info.json``; read a record batch at a time
    a DatasetDict folder     ``dataset_dict.json`` naming its splits, one such folder each:
                             its ``train`` split is read

``datasets`` itself is not needed: its folders are plain Arrow files. Every error names the
file and, once reading has begun, the row group (Parquet) or record batch (Arrow).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import UserError

STATE, INFO, SPLITS = "state.json", "dataset_info.json", "dataset_dict.json"


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def is_dataset_folder(path: Path) -> bool:
    """Whether ``path`` was written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return path.is_dir() and ((path / STATE).is_file() or (path / SPLITS).is_file())


def dataset_files(folder: Path) -> list[Path]:
    """The Arrow files of a save_to_disk folder, in the dataset's row order (a DatasetDict:
    its ``train`` split's)."""
    if (folder / SPLITS).is_file():
        try:
            splits = json.loads((folder / SPLITS).read_text(encoding="utf-8"))["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"{folder / SPLITS} is damaged: it should list the splits") from None
        if "train" not in splits:
            names = ", ".join(map(str, splits)) or "none"
            raise UserError(f"{folder} is a dataset with the splits {names} but no train split; "
                            f"pass one of them: --data {folder / str(splits[0])}" if splits else
                            f"{folder} is a dataset without splits")
        return dataset_files(folder / "train")
    try:
        state = json.loads((folder / STATE).read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state.get("_data_files", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UserError(f"{folder / STATE} is damaged: it should list the Arrow files") from None
    files = [folder / name for name in names] or sorted(folder.glob("*.arrow"))
    missing = [f.name for f in files if not f.is_file()]
    if not files or missing:
        what = f"its Arrow file {missing[0]} is missing" if missing else "it holds no .arrow file"
        raise UserError(f"{folder} is a datasets save_to_disk folder, but {what} (save it "
                        f"again with save_to_disk)")
    return files


def _check_column(path: Path, schema, field: str) -> None:
    import pyarrow as pa

    if field not in schema.names:
        raise UserError(f"{path}: no column {field!r}; its columns are "
                        f"{', '.join(schema.names) or 'none'} (--text_field NAME reads "
                        f"another)")
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):  # dictionary-encoded text (pandas' category): its values
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or getattr(pa.types, "is_string_view", lambda _: False)(kind)):
        raise UserError(f"{path}: column {field!r} holds {kind}, not text "
                        f"(--text_field NAME reads another column)")


NULL_HINT = "prepare --errors skip leaves such rows out"  # (and JSON Lines records)

# The records and rows --errors skip has left out, where a reader counts them.
_dropped: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("dropped",
                                                                           default=None)


@contextlib.contextmanager
def counting_dropped():
    """Within, the records and rows that --errors skip leaves out one by one (JSON Lines
    records and Parquet/Arrow rows without their text) are counted: yields [count]."""
    count = [0]
    token = _dropped.set(count)
    try:
        yield count
    finally:
        _dropped.reset(token)


def note_dropped() -> None:
    """One record or row left out (counted inside ``counting_dropped``)."""
    if (count := _dropped.get()) is not None:
        count[0] += 1


def _rows(path: Path, values: list, where: str, skip_null: bool) -> Iterator[tuple[str, str]]:
    for j, text in enumerate(values):
        if text is None:
            if skip_null:
                note_dropped()
                continue
            raise UserError(f"{path}: {where}, row {j}: the text is missing (null); "
                            f"{NULL_HINT}")
        yield text, f"{path} ({where}, row {j})"


def parquet_rows(path: Path, field: str, skip_null: bool = False
                 ) -> Iterator[tuple[str, str]]:
    """(text, where) of each row of a Parquet file, a row group at a time; ``skip_null``
    leaves out rows whose text is missing, which are an error otherwise."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None
    _check_column(path, schema, field)
    for i in range(pf.num_row_groups):
        try:
            values = pf.read_row_group(i, columns=[field]).column(field).to_pylist()
        except (pa.ArrowException, OSError, ValueError) as e:  # ValueError: bad UTF-8
            raise UserError(f"{path}: row group {i} cannot be read ({_first_line(e)}); the "
                            f"file is damaged") from None
        yield from _rows(path, values, f"row group {i}", skip_null)


def _open_arrow(path: Path):
    import pyarrow as pa

    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(source)  # what save_to_disk writes
    except pa.ArrowInvalid:
        return pa.ipc.open_file(source)  # the random-access (Feather v2) layout


def arrow_rows(path: Path, field: str, skip_null: bool = False) -> Iterator[tuple[str, str]]:
    """(text, where) of each row of an Arrow file, a record batch at a time (``skip_null``
    as for ``parquet_rows``)."""
    import pyarrow as pa

    try:
        reader = _open_arrow(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: not a readable Arrow file ({_first_line(e)})") from None
    _check_column(path, reader.schema, field)
    stream = hasattr(reader, "read_next_batch")
    count = None if stream else reader.num_record_batches
    i = 0
    while count is None or i < count:
        try:
            batch = reader.read_next_batch() if stream else reader.get_batch(i)
            values = batch.column(field).to_pylist()
        except StopIteration:
            return
        except (pa.ArrowException, OSError, ValueError) as e:
            raise UserError(f"{path}: record batch {i} cannot be read ({_first_line(e)}); the "
                            f"file is damaged") from None
        yield from _rows(path, values, f"record batch {i}", skip_null)
        i += 1
