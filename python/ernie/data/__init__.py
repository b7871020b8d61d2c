"""ernie.data: token datasets for training.

- `IndexedDataset` / `IndexedDatasetBuilder` (indexed.py): Megatron-LM's
  `.bin` / `.idx` format, read memory-mapped and validated, written streaming.
- `prepare` (preprocess.py; `python -m ernie.data prepare`): .jsonl and .txt
  tokenized with a Hugging Face tokenizer.json, in parallel processes.
- `PackedSamples` and `DataLoader` (sampler.py): documents packed into
  samples of seq_len + 1 tokens, a train / valid split by document, one
  global sample order for any number of processes and dp degree, the rows of
  a data-parallel rank prefetched in a thread, and a resumable position.

docs/guide/data.md shows them at work.
"""

from .indexed import (DTYPE_CODES, IndexedDataset, IndexedDatasetBuilder, optimal_dtype,
                      write_stats)
from .preprocess import load_tokenizer, prepare
from .sampler import Batch, DataLoader, PackedSamples

__all__ = ["DTYPE_CODES", "Batch", "DataLoader", "IndexedDataset", "IndexedDatasetBuilder",
           "PackedSamples", "load_tokenizer", "optimal_dtype", "prepare", "write_stats"]
