"""Special token ids shared by the tokenizer, the objectives and generation.

A module of its own, below both `jaxformer.data` (whose pipeline applies the objectives) and
`jaxformer.objectives` (which frame examples with these ids).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens of one vocabulary.

    The default layout is the one `jaxformer.data.tokenizer` trains: pad 0, eos 1, bos 2, unk 3,
    ``[MASK]`` 4, ``[CLS]`` 5, ``[SEP]`` 6, then the T5 sentinels ``<extra_id_0>``… from 7.
    """

    vocab_size: int
    pad_id: int = 0
    eos_id: int = 1
    bos_id: int = 2
    unk_id: int = 3
    mask_id: int = 4
    cls_id: int = 5
    sep_id: int = 6
    sentinel_ids: tuple[int, ...] = tuple(range(7, 7 + 100))

    @property
    def all_special(self) -> tuple[int, ...]:
        return (self.pad_id, self.eos_id, self.bos_id, self.unk_id, self.mask_id, self.cls_id,
                self.sep_id, *self.sentinel_ids)

    @property
    def num_special(self) -> int:
        return len(set(self.all_special))

    def ids_to_decode(self, ids) -> list[int]:
        """The ids a tokenizer's ``decode`` renders: up to the first EOS, padding skipped; an id
        outside ``[0, vocab_size)`` is a ValueError (JAX would have clamped it silently)."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i == self.pad_id:
                continue
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is out of range for a vocabulary of "
                                 f"{self.vocab_size}")
            out.append(i)
        return out
