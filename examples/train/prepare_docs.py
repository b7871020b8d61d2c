"""The example training job's data: ernie's own documentation as a corpus.

    python examples/train/prepare_docs.py OUT

Trains a byte-level BPE tokenizer (vocabulary 512, with `tokenizers`) on
the repository's Markdown files, one document per file, writes it to
OUT/tokenizer.json, and tokenizes the files into OUT/docs.bin / docs.idx
(Megatron's format) with `python -m ernie.data prepare`'s function,
appending the end-of-document token. Offline and deterministic.
"""

import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ernie.data import prepare

ROOT = Path(__file__).resolve().parents[2]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in ROOT.rglob("*.md")
                   if not any(part.startswith((".", "build")) for part in p.relative_to(ROOT).parts))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator((p.read_text(errors="replace") for p in files), trainer)
    tok.save(str(out / "tokenizer.json"))
    # One document per file: a .txt input is a document unless txt_lines.
    corpus = out / "text"
    corpus.mkdir(exist_ok=True)
    inputs = []
    for i, p in enumerate(files):
        target = corpus / f"{i:04d}.txt"
        target.write_text(p.read_text(errors="replace"))
        inputs.append(target)
    summary = prepare(out / "tokenizer.json", inputs, out / "docs", workers=1,
                      append_eos=True, eos_token="</s>")
    print(f"{len(files)} documents, {summary['tokens']} tokens -> {out / 'docs'} "
          f"(eos id {summary['eos_id']})")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/train-example"))
