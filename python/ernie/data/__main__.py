"""ernie/data/__main__.py - the command line of ernie.data.

    python -m ernie.data prepare --tokenizer tokenizer.json --input a.jsonl b.txt \
        --output corpus [--workers N] [--append-eos [--eos-token T]] [--json-key text]
        [--txt-lines]
    python -m ernie.data info corpus [--vocab-size V]

A bad input (a tokenizer that does not load, a missing file, a JSON line
without the key, a damaged .bin / .idx) prints one line naming the file and
exits 1.
"""

import argparse
import sys

from .indexed import IndexedDataset
from .preprocess import prepare


def _parser():
    parser = argparse.ArgumentParser(prog="python -m ernie.data",
                                     description="Token datasets in Megatron-LM's format.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenize .jsonl / .txt files into PREFIX.bin/.idx")
    p.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    p.add_argument("--input", required=True, nargs="+", help=".jsonl and .txt files")
    p.add_argument("--output", required=True, help="the output prefix: PREFIX.bin, PREFIX.idx")
    p.add_argument("--workers", type=int, default=None,
                   help="tokenizing processes (default: one per CPU)")
    p.add_argument("--append-eos", action="store_true", help="an EOS token after each document")
    p.add_argument("--eos-token", default=None,
                   help="the EOS token's text (default: the first of </s>, <|endoftext|>, ...)")
    p.add_argument("--json-key", default="text", help="the text's key in .jsonl lines")
    p.add_argument("--txt-lines", action="store_true",
                   help="a .txt file holds one document per line (default: one per file)")
    i = sub.add_parser("info", help="validate PREFIX.bin/.idx and print its counts")
    i.add_argument("prefix")
    i.add_argument("--vocab-size", type=int, default=None,
                   help="also check every token id is below this")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "prepare":
            prepare(args.tokenizer, args.input, args.output, workers=args.workers,
                    append_eos=args.append_eos, eos_token=args.eos_token,
                    json_key=args.json_key, txt_lines=args.txt_lines)
        else:
            ds = IndexedDataset(args.prefix)
            lo, hi = ds.token_range()
            if args.vocab_size is not None:
                ds.check_vocab(args.vocab_size)
            print(f"{args.prefix}: {ds.documents} documents, {len(ds)} sequences, "
                  f"{ds.n_tokens} tokens of {ds.dtype}, token ids {lo}..{hi}")
    except (ValueError, OSError) as e:
        print(f"python -m ernie.data {args.command}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
