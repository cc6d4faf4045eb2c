"""Builds the RIL group: G student samples and G teacher answers per question, as one token batch."""
from __future__ import annotations

import torch

from protege.generation.transformers_backend import Completions


def build_group(student: Completions, prompt_ids: torch.Tensor, teacher_texts: list[list[str]], processor,
                G: int) -> tuple[Completions, torch.Tensor, list[str]]:
    """Rows per question: its G student samples, then its teacher answers (tokenized + end-of-turn).

    student: B*G rows; prompt_ids: [B, P] left-padded; teacher_texts: B lists (empty = none in the group)
    -> (Completions over all rows, is_teacher [rows] bool, texts [rows]).
    """
    P = student.prompt_len
    s_comp, s_mask = student.sequences[:, P:], student.completion_mask  # [B*G, Ls]
    pad, eos, tokenizer = processor.pad_token_id, processor.eos_token_id, processor.tokenizer
    t_ids = [[tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts] for texts in teacher_texts]
    L = max([s_comp.shape[1]] + [len(x) for q in t_ids for x in q])
    dev = prompt_ids.device  # the group is built where the models will score it
    seqs, masks, is_teacher, texts = [], [], [], []
    for b in range(prompt_ids.shape[0]):
        for g in range(G):
            row = b * G + g
            comp = torch.full((L,), pad, dtype=torch.long, device=dev)
            mask = torch.zeros(L, dtype=torch.long, device=dev)
            comp[: s_comp.shape[1]] = s_comp[row]
            mask[: s_comp.shape[1]] = s_mask[row]
            seqs.append(torch.cat([prompt_ids[b], comp]))
            masks.append(mask)
            is_teacher.append(False)
            texts.append(student.texts[row])
        for ids, text in zip(t_ids[b], teacher_texts[b]):
            comp = torch.full((L,), pad, dtype=torch.long, device=dev)
            mask = torch.zeros(L, dtype=torch.long, device=dev)
            comp[: len(ids)] = torch.tensor(ids, device=dev)
            mask[: len(ids)] = 1
            seqs.append(torch.cat([prompt_ids[b], comp]))
            masks.append(mask)
            is_teacher.append(True)
            texts.append(text)
    return (Completions(torch.stack(seqs), P, torch.stack(masks), texts), torch.tensor(is_teacher), texts)
