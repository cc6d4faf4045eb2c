"""GTR-Turbo's free teacher: a merge of every checkpoint the running RL job has produced.

The trainable weights c_k join the merge after every update, or after every PPO epoch (GTR-Turbo's code
saves a checkpoint per epoch: `gtr.merge_every`). With pi_init the weights before the first update:
- `average`: M_k = ((k - 1) M_{k-1} + c_k) / k = (1/k) sum_{j<=k} c_j
- `ema`:     M_k = (1 - alpha) M_{k-1} + alpha c_k, M_0 = pi_init
- `ties`:    M_k = pi_init + TIES(c_1 - pi_init, ..., c_k - pi_init; density), every task vector weight 1
- `ties_running` (GTR-Turbo's code, as it intends): M_k = pi_init + TIES(M_{k-1} - pi_init, c_k - pi_init;
  density) with weights (k-1)/k and 1/k and no renormalisation, so each checkpoint weighs as much as every
  earlier one (M_1 = c_1 where TIES keeps an entry). The code's own weights 1/(cnt+4) count the adapters it
  has loaded (four per update, one per PPO epoch); as written the code keeps the first update's merge for the
  rest of the run (peft does not overwrite an adapter of the same name): `teacher: first` is that arm.
M_0 = pi_init for all. `teacher` picks the control arms: `running` (the merge goes on), `init` (the teacher is
pi_init for the whole run: a KL anchor to the warm start) and `first` (the teacher stops after the first
update's merge). `ties` keeps every task vector (memory grows by one copy of the trainable weights per
update, on the CPU); the others keep one running copy. Nothing is ever dropped: the tests
check M_k against the closed form over all k checkpoints.
"""
from __future__ import annotations

import time

import torch

from protege.merging.methods import ties as ties_merge


class MergedTeacher:
    per_rank = False  # a state part (protege.runtime.state): one whole copy, written by rank 0

    def __init__(self, init: dict[str, torch.Tensor], method: str, ema_alpha: float = 0.1,
                 ties_density: float = 0.8, teacher: str = "running"):
        if method not in ("average", "ema", "ties", "ties_running"):
            raise ValueError(f"unknown merged-teacher method {method!r}; expected average, ema, ties or ties_running")
        if teacher not in ("running", "init", "first"):
            raise ValueError(f"unknown merged-teacher arm {teacher!r}; expected running, init or first")
        self.method, self.alpha, self.density, self.teacher = method, ema_alpha, ties_density, teacher
        self.updates = 0  # updates ended (end_update): `first` merges during the first one only
        self.init = {k: v.detach().to("cpu", torch.float32).clone() for k, v in init.items()}
        self.merged = {k: v.clone() for k, v in self.init.items()}
        self.count = 0
        self.task_vectors: list[dict[str, torch.Tensor]] = []
        self.seconds = 0.0  # time spent merging by the last `add`

    @property
    def accepting(self) -> bool:
        return self.teacher == "running" or (self.teacher == "first" and self.updates == 0)

    def end_update(self) -> None:
        """One RL update ended (its epochs' checkpoints, if merged per epoch, are in)."""
        self.updates += 1

    def add(self, weights: dict[str, torch.Tensor]) -> None:
        """Joins checkpoint c_{k+1} (the trainable weights after an update or an epoch) to the merge; a frozen
        arm (`init`, or `first` after its first update) keeps its teacher."""
        if not self.accepting:
            self.seconds = 0.0
            return
        t0 = time.perf_counter()
        if set(weights) != set(self.init):
            raise ValueError(f"checkpoint tensors differ from the merge's: {sorted(set(weights) ^ set(self.init))[:5]}")
        self.count += 1
        k = self.count
        for name, w in weights.items():
            c = w.detach().to("cpu", torch.float32)
            if self.method == "average":
                self.merged[name] = self.merged[name] * ((k - 1) / k) + c / k
            elif self.method == "ema":
                self.merged[name] = (1 - self.alpha) * self.merged[name] + self.alpha * c
        if self.method == "ties_running":
            w_prev, w_new = (k - 1) / k, 1 / k
            for name, w in weights.items():
                tvs = torch.stack([self.merged[name] - self.init[name],
                                   w.detach().to("cpu", torch.float32) - self.init[name]])  # [2, *shape]
                self.merged[name] = self.init[name] + ties_merge(tvs, [w_prev, w_new], self.density, normalize=False)
        if self.method == "ties":
            self.task_vectors.append({n: w.detach().to("cpu", torch.float32) - self.init[n] for n, w in weights.items()})
            for name, base in self.init.items():
                tvs = torch.stack([tv[name] for tv in self.task_vectors])  # [k, *shape]
                self.merged[name] = base + ties_merge(tvs, [1.0] * k, self.density)
        self.seconds = time.perf_counter() - t0

    @torch.no_grad()
    def load_into(self, model: torch.nn.Module) -> None:
        """Writes the merged weights into `model` (the teacher module; its other weights are pi_init's)."""
        params = dict(model.named_parameters())
        for name, value in self.merged.items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))

    # a state part: the merge survives a resume exactly
    def dump(self):
        tensors = {f"merged/{k}": v for k, v in self.merged.items()}
        tensors.update({f"tv{j}/{k}": v for j, tv in enumerate(self.task_vectors) for k, v in tv.items()})
        return tensors, {"count": self.count, "method": self.method, "teacher": self.teacher, "updates": self.updates}

    def load(self, tensors, extras):
        if extras["method"] != self.method:
            raise ValueError(f"saved merged teacher is {extras['method']!r}, this run's is {self.method!r}")
        if extras.get("teacher", "running") != self.teacher:
            raise ValueError(f"saved merged teacher is the {extras.get('teacher')!r} arm, this run's is {self.teacher!r}")
        self.count = extras["count"]
        self.updates = extras.get("updates", 0)
        self.merged = {k[len("merged/"):]: v.clone() for k, v in tensors.items() if k.startswith("merged/")}
        self.task_vectors = [{k.split("/", 1)[1]: v.clone() for k, v in tensors.items() if k.startswith(f"tv{j}/")}
                             for j in range(self.count if self.method == "ties" else 0)]


def trainable_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What an update changes, under the teacher's names: the trainable parameters, or for a LoRA policy the
    adapted modules' merged weights W + scale * B A (the teacher is a plain model without adapters)."""
    from protege.models.lora import is_lora, merged_adapted_weights

    if is_lora(model):
        return merged_adapted_weights(model)
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def teacher_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """The frozen module the merge is loaded into (pi_init's weights until the first update)."""
    import copy

    from protege.models.lora import is_lora, plain_copy

    return plain_copy(policy) if is_lora(policy) else copy.deepcopy(policy).eval().requires_grad_(False)
