"""Data at the side of the layers: text corpora and their token windows, parallel corpora.

    text.py             corpora (bundled names or files), the train/val split, random windows
    sources.py          the files and documents prepare reads (text, JSONL), their fingerprints
    tables.py           Parquet files and datasets' save_to_disk folders, one document a row
    cache.py            the implicit cache of prepared folders (train --data file.txt)
    shards.py           prepared corpora: token files written once, read as memory maps
    prepare.py          prepare: fit the tokenizer on the sources, stream them into shards
    reading.py          the sources a block at a time (a file is never held whole)
    pieces.py           where text may be cut into pieces that encode to the whole's ids
    encode.py           encoders (char table, tiktoken, tokenizers) in worker processes
    parallel_corpus.py  sentence pairs: TSV or two aligned files, the split by chapters,
                        length-bucketed batches and their padding
"""

from .parallel_corpus import (
    ParallelCorpus,
    ParallelDataConfig,
    bucket_batches,
    collate,
    encode_pairs,
    load_parallel,
    source_ids,
    split_indices,
)
from .text import (
    BUNDLED,
    check_length,
    corpus_path,
    get_batch,
    load_text,
    normalize_newlines,
    split_ids,
)

__all__ = ["BUNDLED", "ParallelCorpus", "ParallelDataConfig", "bucket_batches", "check_length",
           "collate", "corpus_path", "encode_pairs", "get_batch", "load_parallel", "load_text",
           "normalize_newlines", "source_ids", "split_ids", "split_indices"]
