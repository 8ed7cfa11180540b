"""Distillation's memory beside the student's training state: the frozen teacher, its forward
under no grad, both models' logits and the KD loss's working set, hidden-state losses.

The step runs as torchtune's knowledge-distillation recipes run it
(recipes/knowledge_distillation_{single_device,distributed}.py, ``_loss_step``): the
student's forward, then ``with torch.no_grad(): teacher_logits = teacher(tokens)``, then the
class loss and ``kd_loss_fn(logits, teacher_logits, labels)``, then ``del teacher_logits`` and
the backward. So everything here comes on top of the student at the end of its forward (its
activations, its logits and its loss, the planner's own student model), at two moments:

- the teacher's forward: the teacher's weights (and, sharded by FSDP, the blocks it
  gathers), the streams and MLP/attention tensors of the block running (no grad keeps
  nothing else: planner.memory.inference.prefill_activation_bytes), the hidden states the
  hidden-state losses will read, then the teacher's logits it returns;
- the KD loss: the teacher's logits and, per logit, torchtune ForwardKLLoss's tensors
  (torchtune/modules/loss/kd_losses.py): ``softmax(teacher_logits, dtype=float32)`` and
  ``log_softmax(student_logits, dtype=float32)`` (both saved for the backward), the bool
  ``isinf`` mask, their product and its ``masked_fill`` copy (fp32 each, freed after the sum):
  4 x 4 + 1 = 17 bytes per logit at once; the chunked loss (ForwardKLWithChunkedOutputLoss)
  has one chunk of the tokens in flight at a time (KD_CHUNKS), holding the two saved fp32
  tensors and the mask (9 bytes per logit) of the chunks done.

Offline distillation from stored top-k logits (no teacher on the GPUs) reads k values (fp32)
and k int64 indices per token, and gathers the student's log-probabilities at them: the
student's fp32 log-softmax over the vocabulary (4 bytes per logit, saved) and 3 x k x 4
bytes per token of gathered values.

Hidden-state losses (Minitron, arXiv:2408.11796, Sec. 3; ModelOpt's intermediate layer
pairs) keep, per layer pair, the teacher's hidden state (16-bit) and, where the widths
differ, the student's state projected to the teacher's width by a trained linear map
(its weights, gradients and optimizer states are counted); the MSE upcasts both to fp32 and
saves them for its backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.layouts.layout import Layout
from planner.memory.inference import LoadSetup, load_weight_bytes, prefill_activation_bytes
from planner.memory.params import optimizer_state_bytes
from planner.models.spec import ModelSpec
from planner.training.kernels import layout_kernels
from planner.training.posttrain import KD_CHUNKS, DistillSetup
from planner.training.setup import TrainingSetup
from planner.units import ceil_div

# bytes per logit element of torchtune's ForwardKLLoss at its forward's peak (module docstring)
KD_FULL_BYTES_PER_LOGIT = 17
# bytes per logit element it keeps for the backward: two fp32 tensors and the bool mask
KD_SAVED_BYTES_PER_LOGIT = 9
# the student's eager loss term counts 12 B per logit at the start of its backward: the fp32
# log-probabilities cross entropy keeps (4) and the two fp32 gradients its backward creates (8)
# (memory.loss.logits_bytes); while the KD loss runs, before any backward, the 8 do not exist.
# Megatron's fused loss (4 B, kept) and torchtitan's chunked loss create none beforehand.
STUDENT_LOSS_GRAD_BYTES_PER_LOGIT = {"eager": 8, "amp": 8}
# FSDP gathers the running block and prefetches the next (FSDP2's default forward prefetch)
FSDP_GATHERED_BLOCKS = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class DistillMemory:
    """Bytes a distillation step adds to one rank of the student's plan, by term."""

    sharding: str                 # how the teacher is held: replicated | fsdp | tp | offline
    teacher_weights: int          # the teacher's stored weights on this rank
    teacher_gathered: int         # FSDP: the blocks gathered for its forward
    teacher_forward: int          # its forward's working set under no grad (one block's tensors)
    teacher_logits: int           # its logits for the micro-batch (16-bit)
    student_logits: int           # the student's logits kept until the KD loss has read them
    kd_loss: int                  # the KD loss's working set at its peak
    kd_saved: int                 # what the KD loss keeps for its backward after its forward
    hidden: int                   # hidden-state losses: the teacher's states kept for them
    hidden_mse: int               # their MSEs: the projected student states and both fp32 copies
    projection_states: int        # the trained projections' weights, gradients and optimizer states
    offline_topk: int             # offline: the stored top-k values and indices of the micro-batch
    # the part of the student's own loss term (memory.loss.logits_bytes) that does not exist yet
    # while the KD loss runs: under eager ops the two fp32 logit gradients of its backward
    student_loss_grads: int = 0

    @property
    def forward_moment(self) -> int:
        """The teacher's forward: its weights, gathered blocks, working set or its logits."""
        return (self.teacher_weights + self.teacher_gathered + self.hidden + self.projection_states
                + max(self.teacher_forward, self.teacher_logits) + self.student_logits - self.student_loss_grads)

    @property
    def loss_moment(self) -> int:
        """The KD loss (or after it, the hidden-state MSEs beside what it saved): the teacher's
        logits and the loss's tensors beside the student's, less the student's loss gradients
        that its backward has not made yet (the student's peak counts them)."""
        return (self.teacher_weights + self.hidden + self.projection_states + self.teacher_logits
                + self.student_logits + max(self.kd_loss, self.kd_saved + self.hidden_mse) + self.offline_topk
                - self.student_loss_grads)

    @property
    def extra(self) -> int:
        """What the step adds at its peak (the larger moment), bytes."""
        return max(self.forward_moment, self.loss_moment)

    def peak_terms(self) -> dict[str, int]:
        """The terms at the peak moment, by field name, summing to ``extra`` (the student's loss
        gradients not yet made, ``student_loss_grads``, negative)."""
        common = {"teacher_weights": self.teacher_weights, "hidden": self.hidden,
                  "projection_states": self.projection_states, "student_logits": self.student_logits}
        if self.loss_moment >= self.forward_moment:
            kd_first = self.kd_loss >= self.kd_saved + self.hidden_mse
            terms = common | {"teacher_logits": self.teacher_logits, "offline_topk": self.offline_topk,
                              "kd_loss": self.kd_loss if kd_first else self.kd_saved,
                              "hidden_mse": 0 if kd_first else self.hidden_mse}
        else:
            forward_first = self.teacher_forward >= self.teacher_logits
            terms = common | {"teacher_gathered": self.teacher_gathered,
                              "teacher_forward": self.teacher_forward if forward_first else 0,
                              "teacher_logits": 0 if forward_first else self.teacher_logits}
        return terms | {"student_loss_grads": -self.student_loss_grads}

    @property
    def peak_moment(self) -> str:
        return "KD loss" if self.loss_moment >= self.forward_moment else "teacher forward"

    def as_dict(self) -> dict[str, int | str]:
        return {"sharding": self.sharding, "teacher_weights": self.teacher_weights,
                "teacher_gathered": self.teacher_gathered, "teacher_forward": self.teacher_forward,
                "teacher_logits": self.teacher_logits, "student_logits": self.student_logits,
                "kd_loss": self.kd_loss, "kd_saved": self.kd_saved, "hidden": self.hidden,
                "hidden_mse": self.hidden_mse, "projection_states": self.projection_states,
                "offline_topk": self.offline_topk, "student_loss_grads": self.student_loss_grads,
                "extra": self.extra, "peak_moment": self.peak_moment}


def teacher_shardings(lay: Layout) -> tuple[str, ...]:
    """How the teacher may be held on a layout: replicated always, FSDP over the student's dense
    shard group (Layout.dense_shard_degree: dp x cp x ep) where it is > 1, split like the
    student over tp x pp > 1."""
    out = ["replicated"]
    if lay.dense_shard_degree > 1:
        out.append("fsdp")
    if lay.tp * lay.pp > 1:
        out.append("tp")
    return tuple(out)


def teacher_weight_bytes(teacher: ModelSpec, d: DistillSetup, lay: Layout, sharding: str) -> tuple[int, int]:
    """(stored weights on the rank, gathered blocks of FSDP), bytes. The stored format is
    planner.memory.inference's (16/32-bit, or weight-only quantized linear layers); tp splits
    it as a tensor- and pipeline-parallel model (load_memory's most loaded rank); FSDP shards it
    over the student's dense shard group (Layout.dense_shard_degree: dp x cp x ep, the mesh
    torchtitan's FSDP2 shards dense parameters over, parallel_dims.py "dp_shard_cp") and
    gathers FSDP_GATHERED_BLOCKS blocks at a time."""
    setup = LoadSetup(weight_bytes=d.teacher_weight_bytes, quant=d.teacher_quant)
    if sharding == "tp":
        return load_weight_bytes(teacher, setup, tp=lay.tp, pp=lay.pp), 0
    whole = load_weight_bytes(teacher, setup)
    if sharding == "fsdp":
        block = ceil_div(whole, teacher.n_layers)
        return ceil_div(whole, lay.dense_shard_degree), FSDP_GATHERED_BLOCKS * block
    return whole, 0


def distill_memory(student: ModelSpec, teacher: ModelSpec, setup: TrainingSetup, d: DistillSetup,
                   lay: Layout, sharding: str) -> DistillMemory:
    """The terms of DistillMemory for one student layout and one way of holding the teacher.

    Tokens per rank: Layout.tokens_per_rank (the rules split the sequence evenly over cp);
    the vocabulary is split over tp (Megatron's vocab-parallel logits; ModelOpt's
    distillation loss runs on them), the hidden states over tp under sequence parallelism.
    Student logits are in the activation dtype; the teacher's in its own 16-bit format."""
    tokens = lay.tokens_per_rank
    vocab = ceil_div(student.vocab_size, lay.tp)
    logits = tokens * vocab
    act = setup.precision_spec.activation_bytes
    hidden_split = lay.tp if lay.sp else 1
    grads = logits * STUDENT_LOSS_GRAD_BYTES_PER_LOGIT.get(layout_kernels(setup, lay), 0)
    if not d.online:
        # the student's fp32 log-softmax, and per token k fp32 values, k int64 indices, k gathered
        topk = tokens * d.offline_topk * (4 + 8 + 4)
        return DistillMemory(sharding="offline", teacher_weights=0, teacher_gathered=0, teacher_forward=0,
                             teacher_logits=0, student_logits=logits * act, kd_loss=logits * 4,
                             kd_saved=logits * 4, hidden=0, hidden_mse=0, projection_states=0, offline_topk=topk,
                             student_loss_grads=grads)
    weights, gathered = teacher_weight_bytes(teacher, d, lay, sharding)
    t_tp = lay.tp if sharding == "tp" else 1
    forward = prefill_activation_bytes(teacher, LoadSetup(weight_bytes=d.teacher_weight_bytes,
                                                          batch=lay.micro_batch, context=lay.seq_len_per_rank),
                                       t_tp, last_stage=False)
    saved = logits * KD_SAVED_BYTES_PER_LOGIT
    if d.kd_loss == "full":
        kd = logits * KD_FULL_BYTES_PER_LOGIT
    else:   # the chunks done keep their saved tensors; the running chunk holds the full set
        kd = saved + ceil_div(logits, KD_CHUNKS) * (KD_FULL_BYTES_PER_LOGIT - KD_SAVED_BYTES_PER_LOGIT)
    n = d.kd_hidden_layers
    h_t = ceil_div(teacher.d_model, hidden_split)
    project = student.d_model != teacher.d_model
    # per layer pair: the teacher's 16-bit state; for the MSE the student's projected state
    # (activation dtype) and the fp32 copies of both, which mse_loss saves
    hidden = n * tokens * h_t * d.teacher_weight_bytes
    hidden_mse = n * tokens * h_t * ((act if project else 0) + 2 * 4)
    # a d_student x d_teacher projection per pair, trained like the student (weights, grads, states)
    p = setup.precision_spec
    per_param = p.weight_bytes + p.grad_bytes + p.master_bytes + optimizer_state_bytes(student, setup)
    proj = int(n * student.d_model * teacher.d_model * per_param) if project else 0
    return DistillMemory(sharding=sharding, teacher_weights=weights, teacher_gathered=gathered,
                         teacher_forward=forward, teacher_logits=logits * d.teacher_weight_bytes,
                         student_logits=logits * act, kd_loss=kd, kd_saved=saved, hidden=hidden,
                         hidden_mse=hidden_mse, projection_states=proj, offline_topk=0, student_loss_grads=grads)


def best_distill_memory(student: ModelSpec, teacher: ModelSpec, setup: TrainingSetup, d: DistillSetup,
                        lay: Layout) -> DistillMemory:
    """The teacher held as DistillSetup.teacher_sharding says, or under "auto" the way the
    layout allows (teacher_shardings) that adds the least at the peak."""
    if not d.online:
        return distill_memory(student, teacher, setup, d, lay, "offline")
    allowed = teacher_shardings(lay)
    if d.teacher_sharding != "auto":
        allowed = tuple(s for s in allowed if s == d.teacher_sharding) or ("replicated",)
    return min((distill_memory(student, teacher, setup, d, lay, s) for s in allowed), key=lambda t: t.extra)
