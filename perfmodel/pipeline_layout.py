"""A pipeline layout: which layers each pipeline stage (and each of its virtual stages) holds.

Megatron-Core's --pipeline-model-parallel-layout (megatron/core/transformer/
pipeline_parallel_layer_layout.py) names the model's pieces in order, stage by stage:

    E  the embedding          t  a transformer (decoder) layer
    m  a multi-token-prediction module          L  the output layer and the loss
    |  ends a stage           x*n  n times x    (...)*n  n times the group    ,  cosmetic

"Et|(tt|)*30mL" on pp 8 is 32 stages, 4 per rank (virtual stages): stage k runs on pipeline rank
k mod pp as its chunk k // pp. The layout expresses what --decoder-first/last-pipeline-num-layers
cannot: stages of unequal layers under virtual stages (DeepSeek-V3's 61 layers on pp 8 x 4 chunks).

Megatron expands the repetitions with two regular expressions (groups first, then single
characters); this module reads the same strings the same way, bounded (a repetition that would
build more than MAX_PIECES pieces is refused before it is built), and checks what Megatron checks
(embedding first and loss last, once each; the MTP modules after every decoder layer, together in
one chunk) plus what perfmodel models: the MTP modules on the last rank with the loss and every
rank with at least one decoder layer. perfmodel's pipeline has a first, a last and one kind of
middle stage: where the ranks between hold unequal layers (torchtitan's and NeMo AutoModel's
splits give the first ranks one more), each is costed as the one holding the most
(middle_layers: the slowest sets the pace; the fill and drain, which pass every rank once, count
the others' difference too, an overestimate of the bubble by at most (pp - 2) x that
difference's layers); the dense layers of a mixture of experts may still fall unevenly on them,
perfmodel.step.moe. The reader
is written by hand (a grammar of three tokens): it counts what a repetition builds before it
builds it, which Megatron's regular-expression substitution does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from perfmodel.errors import PlanError

PIECES = "EtmL"
MAX_PIECES = 1_000_000  # pieces (and stage separators) a layout may expand to


def _fail(text: str, why: str) -> PlanError:
    return PlanError(f"pipeline_layout '{text}': {why}")


def _expand(text: str, body: str | None = None) -> str:
    """The layout with its repetitions written out and its commas dropped: (t*2|)*2 -> tt|tt|,
    t*3 -> ttt, as Megatron-Core's parse_str_to_list (groups do not nest; a group's own x*n are
    written out too). body: a group of `text` to expand (text names the layout in errors)."""
    body = text.replace(",", "") if body is None else body
    out: list[str] = []
    size = 0
    i = 0

    def count() -> int:  # the whole number at i, i moved past it
        nonlocal i
        start = i
        while i < len(body) and body[i].isdigit():
            i += 1
        if start == i:
            raise _fail(text, "'*' must be followed by a whole number")
        return int(body[start:i])

    while i < len(body):
        ch = body[i]
        if ch == "(":
            end = body.find(")", i + 1)
            if end < 0:
                raise _fail(text, "a '(' has no ')'")
            group = body[i + 1:end]
            if not group or "(" in group:
                raise _fail(text, "a group '( )' must hold pieces and no other group")
            i = end + 1
            if body[i:i + 1] != "*":
                raise _fail(text, "a group '( )' must be followed by '*n'")
            i += 1
            item, times = _expand(text, group), count()
        elif ch in PIECES or ch == "|":
            i += 1
            times = 1
            if body[i:i + 1] == "*":
                i += 1
                times = count()
            item = ch
        else:
            raise _fail(text, f"unknown character '{ch}': the pieces are E (embedding), "
                              "t (transformer layer), m (MTP module), L (loss), '|' ends a "
                              "stage, 'x*n' and '(...)*n' repeat")
        size += len(item) * times
        if size > MAX_PIECES:
            raise _fail(text, f"expands to more than {MAX_PIECES:,} pieces")
        out.append(item * times)
    return "".join(out)


@dataclass(frozen=True)
class PipelineLayout:
    """A parsed layout over pp pipeline ranks: `stages` in model order (pp x v of them)."""

    text: str
    stages: tuple[str, ...]
    pp: int

    @classmethod
    def parse(cls, text: str, pp: int) -> PipelineLayout:
        """The layout `text` over pp ranks; PlanError naming the layout where it is malformed or
        breaks a rule that needs no model (see the module doc)."""
        text = text.strip()
        stages = tuple(_expand(text).split("|"))
        if len(stages) % pp:
            raise _fail(text, f"has {len(stages)} stages, not a multiple of pp ({pp}): each "
                              "pipeline rank holds the same number of virtual stages")
        layout = cls(text, stages, pp)
        layout._check()
        return layout

    @property
    def virtual_stages(self) -> int:
        return len(self.stages) // self.pp

    def rank_of(self, stage: int) -> int:
        """The pipeline rank that runs stage k: k mod pp (chunk k // pp of it)."""
        return stage % self.pp

    @cached_property
    def flat(self) -> str:
        return "".join(self.stages)

    @cached_property
    def decoder_layers(self) -> tuple[int, ...]:
        """Decoder layers each pipeline rank holds (all its virtual stages)."""
        out = [0] * self.pp
        for k, stage in enumerate(self.stages):
            out[self.rank_of(k)] += stage.count("t")
        return tuple(out)

    @property
    def layers(self) -> int:
        return self.flat.count("t")

    @property
    def middle_layers(self) -> int | None:
        """The decoder layers every rank between the first and the last is costed with where
        they differ (the most any holds), else None (equal: L less the ends' over pp - 2)."""
        middle = self.decoder_layers[1:-1]
        return max(middle) if len(set(middle)) > 1 else None

    @property
    def end_chunks(self) -> tuple[tuple[int, int, int], ...] | None:
        """(first chunk's decoder layers, last chunk's, all of the rank's) of the first rank, the
        rank between with the most layers (the first of them; the last rank's own where pp = 2)
        and the last rank: what an interleaved warm-up holds beyond whole rounds of chunks
        (perfmodel.costs.memory.inflight_micro_batches); None with one chunk per rank."""
        v = self.virtual_stages
        if v == 1:
            return None
        ranks = self.decoder_layers
        between = range(1, self.pp - 1)
        middle = max(between, key=lambda r: ranks[r]) if len(between) else self.pp - 1

        def of(rank: int) -> tuple[int, int, int]:
            return (self.chunk_layers(rank), self.chunk_layers((v - 1) * self.pp + rank),
                    ranks[rank])
        return of(0), of(middle), of(self.pp - 1)

    @property
    def mtp_modules(self) -> int:
        return self.flat.count("m")

    def chunk_layers(self, chunk: int) -> int:
        """Decoder layers of one stage (chunk, in model order)."""
        return self.stages[chunk].count("t")

    def rank_of_layer(self, layer: int) -> int:
        """The pipeline rank that holds decoder layer `layer` (from 0, in model order)."""
        seen = 0
        for k, stage in enumerate(self.stages):
            seen += stage.count("t")
            if layer < seen:
                return self.rank_of(k)
        raise IndexError(layer)

    def dense_split(self, dense: tuple[int, ...]) -> tuple[int, int, int]:
        """How many of the layers `dense` (indices) the first rank, the last rank and the ranks
        between hold."""
        ranks = [self.rank_of_layer(i) for i in dense]
        first = sum(r == 0 for r in ranks)
        last = sum(r == self.pp - 1 for r in ranks)
        return first, last, len(ranks) - first - last

    def _check(self) -> None:
        flat, text = self.flat, self.text
        if self.pp < 2:
            raise _fail(text, "needs pp >= 2")
        if flat.count("E") != 1 or not self.stages[0].startswith("E"):
            raise _fail(text, "must begin with the embedding E, once")
        if flat.count("L") != 1 or not self.stages[-1].endswith("L"):
            raise _fail(text, "must end with the loss L, once")
        if "m" in flat:
            if "t" in flat[flat.index("m"):]:
                raise _fail(text, "the MTP modules m come after every decoder layer t")
            if self.stages[-1].count("m") != self.mtp_modules:
                raise _fail(text, "perfmodel models the MTP modules m on the last stage, with "
                                  "the loss L (Megatron's standalone MTP stage is not modelled)")
        ranks = self.decoder_layers
        if min(ranks[0], ranks[-1]) < 1:
            raise _fail(text, f"the first and the last pipeline rank must hold a decoder layer "
                              f"each (they hold {ranks[0]} and {ranks[-1]})")

    def check_model(self, layers: int, mtp_layers: int) -> None:
        """The rules that need the model: its decoder layers and MTP modules, each once."""
        if self.layers != layers:
            raise _fail(self.text, f"places {self.layers} decoder layers t, the model has "
                                   f"{layers}")
        if self.mtp_modules != mtp_layers:
            raise _fail(self.text, f"places {self.mtp_modules} MTP modules m, the model has "
                                   f"{mtp_layers} (each m before the L, or a model spec with "
                                   f"mtp_layers {self.mtp_modules})")


def accounted_layout(layers: int, pp: int, virtual_stages: int, *, embedding: bool, loss: bool,
                     mtp: int = 0) -> str:
    """The layout of Megatron-Core's account_for_embedding_in_pipeline_split /
    account_for_loss_in_pipeline_split (megatron/core/transformer/transformer_block.py,
    get_num_layers_to_build): the embedding and the loss each count as a layer, the layers plus
    them split evenly over pp x virtual_stages stages, the first stage holding one layer fewer
    for the embedding and the last one fewer for the loss (the MTP modules with the loss).
    Qwen3's 94 layers on pp 8 x 4: 'Et*2|(t*3|)*30t*2L'. PlanError where the layers plus the
    counted ones do not split so."""
    stages = pp * virtual_stages
    total = layers + embedding + loss
    if total % stages or total // stages < max(embedding, loss):
        counted = " and ".join(name for name, on in (("embedding", embedding), ("loss", loss))
                               if on)
        raise PlanError(f"the layers ({layers}) and the {counted} counted as layers ({total}) "
                        f"must split evenly into pp x virtual_stages ({stages}) stages "
                        "(Megatron-Core account_for_embedding/loss_in_pipeline_split)")
    k = total // stages
    first, last = k - embedding, k - loss
    middle = f"(t*{k}|)*{stages - 2}" if stages > 2 else ""
    return f"Et*{first}|{middle}t*{last}{'m' * mtp}L"
