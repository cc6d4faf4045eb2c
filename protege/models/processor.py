"""A model's own transformers processor, as every stage uses it: prompts, training pairs, generation inputs.

It wraps the processor of the model's folder (loaded by `hf_folder.load_processor`), so each family renders
prompts with its own chat template, expands image placeholders its own way and returns the inputs its
model takes (Qwen's image grids and token types, LLaVA's image sizes, SmolVLM's pixel masks, ...). What
protege needs beyond the processor is read off the processor once, by rendering probes:

- the end-of-turn text of an assistant turn (`<|im_end|>`, `<end_of_turn>`, `<end_of_utterance>`, ...), which
  ends every training answer and stops generation;
- the tokens that only the processor places around images (never to be generated);
- which model inputs are per token (like `input_ids`) and how their values follow from the token ids, so a
  sequence protege assembles itself (a completion, a multi-turn episode) gets them too.

Answer-only loss masks come from the rendered template: a training sequence is the rendered prompt, the
answer and the end-of-turn text; the answer's tokens are those after the prompt's own tokens.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from protege.models.hf_folder import CheckpointError, copy_processor_files, load_processor

PROBE_TEXT = "How many shapes are there?"
PROBE_ANSWER = "probe answer"


def _probe_image(size: int = 64) -> Image.Image:
    return Image.new("RGB", (size, size), (120, 60, 200))


@dataclass
class _Probed:
    end_of_turn: str
    eos_token_id: int
    stop_token_ids: list[int]
    placed_ids: list[int]
    per_token: dict[str, dict[int, int]] = field(default_factory=dict)  # key -> {token id: value}, else 0
    input_keys: set[str] = field(default_factory=set)  # what the processor returns for a prompt with an image


class StudentProcessor:
    def __init__(self, processor, source: str | Path, generation_eos: list[int] | None = None):
        self.processor = processor
        self.source = Path(source)
        self._generation_eos = generation_eos or []
        self._probed: _Probed | None = None

    # ------------------------------------------------------------------ construction, saving

    @classmethod
    def from_pretrained(cls, path: str | Path, trust_remote_code: bool = False) -> "StudentProcessor":
        path = Path(path)
        return cls(load_processor(path, trust_remote_code), path, _generation_eos(path))

    @classmethod
    def create(cls, tokenizer, image_size: int, patch_size: int, merge_size: int,
               folder: str | Path | None = None) -> "StudentProcessor":
        """The embedded world's processor: transformers' Qwen2VLProcessor around the world's tokenizer, written
        as an ordinary processor folder (tokenizer, image processor, processor config, chat template) and read
        back like any model's. Every image gives the same number of tokens (min = max pixels)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="protege-processor-"))
        folder.mkdir(parents=True, exist_ok=True)
        pixels = image_size * image_size
        tokenizer.save_pretrained(str(folder))
        Qwen2VLImageProcessorPil(patch_size=patch_size, merge_size=merge_size, temporal_patch_size=2,
                                 min_pixels=pixels, max_pixels=pixels).save_pretrained(str(folder))
        (folder / "chat_template.jinja").write_text(tokenizer.chat_template)
        (folder / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2))
        return cls.from_pretrained(folder)

    def save_pretrained(self, path: str | Path) -> None:
        """The processor's files, as they came from its folder."""
        copy_processor_files(self.source, Path(path))

    # ------------------------------------------------------------------ what the processor holds

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @property
    def image_processor(self):
        return self.processor.image_processor

    @property
    def image_token_id(self) -> int:
        found = getattr(self.processor, "image_token_id", None)
        if isinstance(found, int):
            return found
        token = getattr(self.processor, "image_token", None) or getattr(self.tokenizer, "image_token", None)
        if token is None:
            raise CheckpointError(f"{self.source}: the processor ({type(self.processor).__name__}) names no image token")
        return self.tokenizer.convert_tokens_to_ids(token)

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.eos_token_id

    @property
    def eos_token_id(self) -> int:
        """The token that ends an assistant turn in the chat template."""
        return self._probe().eos_token_id

    @property
    def stop_token_ids(self) -> list[int]:
        """Every token that ends generation: the end-of-turn token, the tokenizer's eos, the model's
        generation config's eos."""
        return self._probe().stop_token_ids

    @property
    def end_of_turn(self) -> str:
        return self._probe().end_of_turn

    @property
    def vision_token_ids(self) -> list[int]:
        """Tokens that only the processor or the template places around images (never generated)."""
        return self._probe().placed_ids

    # ------------------------------------------------------------------ rendering

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        kw = dict(tokenize=False, add_generation_prompt=add_generation_prompt)
        try:
            return self.processor.apply_chat_template(messages, **kw)
        except AttributeError:
            if getattr(self.processor, "video_processor", "absent") is not None:
                raise
            # a family's own apply_chat_template may read its video processor's settings even for images
            # (SmolVLM: num_frames); on the image-only path the generic one renders the same template
            from transformers.processing_utils import ProcessorMixin

            return ProcessorMixin.apply_chat_template(self.processor, messages, **kw)

    @staticmethod
    def user_message(text: str, n_images: int = 0, role: str = "user") -> dict:
        return {"role": role, "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}

    def prompt(self, question: str, n_images: int = 1) -> str:
        return self.render([self.user_message(question, n_images)], add_generation_prompt=True)

    def continuation(self, text: str, n_images: int = 0, role: str = "user") -> str:
        """What the template writes after an assistant turn's end-of-turn text for one more message of `role`
        (a new observation, a tool's output), through the next assistant header. A template that knows no
        such role renders the message as the user's."""
        marker = PROBE_ANSWER + self.end_of_turn
        history = [self.user_message(PROBE_TEXT), {"role": "assistant", "content": [{"type": "text",
                                                                                      "text": PROBE_ANSWER}]}]
        for r in dict.fromkeys([role, "user"]):
            try:
                full = self.render(history + [self.user_message(text, n_images, r)], add_generation_prompt=True)
            except Exception:  # noqa: BLE001 -- jinja's raise_exception: a role this template refuses
                continue
            at = full.rfind(marker)
            if at >= 0:
                return full[at + len(marker):]
        raise CheckpointError(f"{self.source}: the chat template cannot continue a conversation after an assistant "
                              f"turn with a '{role}' message; multi-turn episodes need one")

    # ------------------------------------------------------------------ encoding

    @staticmethod
    def image_lists(images: list) -> list[list[Image.Image]]:
        """Each prompt's images: a single image, a list of images, or None / [] for none."""
        return [[] if im is None else list(im) if isinstance(im, (list, tuple)) else [im] for im in images]

    def _call(self, texts: list[str], per_prompt: list[list[Image.Image]], padding_side: str) -> dict:
        """The processor on rendered texts: placeholders expanded the family's way, padded, with the vision
        inputs its model takes."""
        kw = dict(text=texts, padding=True, padding_side=padding_side, return_tensors="pt", add_special_tokens=False)
        if any(per_prompt):
            kw["images"] = [[im.convert("RGB") for im in ims] for ims in per_prompt]
        out = self.processor(**kw)
        if "images" not in kw:  # text only: the model runs as a plain language model, on ids and attention
            return {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}
        return {k: v for k, v in out.items() if torch.is_tensor(v)}

    def encode_prompts(self, questions: list[str], images: list) -> dict[str, torch.Tensor]:
        """Left-padded prompts for generation; `images[i]` is one image, a list of images, or None."""
        per_prompt = self.image_lists(images)
        return self._call([self.prompt(q, len(ims)) for q, ims in zip(questions, per_prompt)], per_prompt, "left")

    def engine_prompt_ids(self, questions: list[str], images: list) -> list[list[int]]:
        """Each prompt's token ids as the chat template writes them, one placeholder per image, NOT expanded: what
        a generation engine that runs the model's own prompt update (vLLM) must be given. The engine expands them
        to exactly `encode_prompts`' ids (unpadded); handing it already expanded ids would expand every image a
        second time."""
        per_prompt = self.image_lists(images)
        return [self.tokenizer(self.prompt(q, len(ims)), add_special_tokens=False)["input_ids"]
                for q, ims in zip(questions, per_prompt)]

    def answer_token_counts(self, prompts: list[str], answers: list[str]) -> list[int]:
        """Tokens of each `answer + end_of_turn` at the end of its training sequence. The prompt's tokens are a
        prefix of the sequence's where the tokenizer splits at the boundary (templates end their generation
        prompt with a newline or a special token); where it does not, the boundary token counts as answer."""
        counts = []
        for p, a in zip(prompts, answers):
            head = self.tokenizer(p, add_special_tokens=False)["input_ids"]
            full = self.tokenizer(p + a + self.end_of_turn, add_special_tokens=False)["input_ids"]
            common = 0
            for x, y in zip(head, full):
                if x != y:
                    break
                common += 1
            counts.append(len(full) - common)
        return counts

    def encode_pairs(self, questions: list[str], images: list, answers: list[str],
                     padding_side: str = "right") -> dict[str, torch.Tensor]:
        """Prompt + answer + end-of-turn, with `answer_mask` marking the answer's tokens (loss targets)."""
        per_prompt = self.image_lists(images)
        prompts = [self.prompt(q, len(ims)) for q, ims in zip(questions, per_prompt)]
        out = self._call([p + a + self.end_of_turn for p, a in zip(prompts, answers)], per_prompt, padding_side)
        attn = out["attention_mask"]
        lengths = attn.sum(dim=1).tolist()
        width = attn.shape[1]
        answer_mask = torch.zeros_like(attn)
        for i, (n, k) in enumerate(zip(lengths, self.answer_token_counts(prompts, answers))):
            end = n if padding_side == "right" else width
            answer_mask[i, end - k:end] = 1
        out["answer_mask"] = answer_mask
        return out

    def token_length(self, question: str, answer: str, image) -> int:
        """Tokens the model sees for prompt + answer, image tokens included."""
        per_prompt = self.image_lists([image])
        text = self.prompt(question, len(per_prompt[0])) + answer + self.end_of_turn
        return int(self._call([text], per_prompt, "right")["attention_mask"].sum())

    def check_images(self, rows, where: str) -> None:
        """Every image size in `rows` (objects with `.id` and `.image`: one image, a list, or None) goes through
        the image processor once, before any compute; a size it refuses (Qwen's aspect ratio over 200, say) is
        a UserFacingError naming the table, the row and the size. Rows that read their sizes from the image
        files' headers (`image_sizes()`, protege.data.rows.Row) are checked without decoding a pixel."""
        from protege.errors import UserFacingError

        seen: set[tuple[int, int]] = set()
        for row in rows:
            sizes = row.image_sizes() if callable(getattr(row, "image_sizes", None)) else \
                [im.size for im in self.image_lists([row.image])[0]]
            for size in sizes:
                if size in seen:
                    continue
                try:
                    self.image_processor(images=[[Image.new("RGB", size)]], return_tensors="pt")
                except Exception as exc:  # noqa: BLE001 -- each image processor raises its own types
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise UserFacingError(f"{where}: row id={row.id!r}: image {size[0]}x{size[1]} cannot go "
                                          f"through the model's image processor "
                                          f"({type(self.image_processor).__name__}): {first}") from None
                seen.add(size)

    # ------------------------------------------------------------------ sequences protege assembles

    def expand(self, text: str, images: list[Image.Image]) -> list[int]:
        """Token ids of rendered text with its image placeholders expanded, as the processor would."""
        if not images:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._call([text], [images], "right")["input_ids"][0].tolist()

    def vision_inputs(self, per_row: list[list[Image.Image]]) -> dict[str, torch.Tensor]:
        """The image processor's inputs for rows whose images appear in this order (empty: text only)."""
        if not any(per_row):
            return {}
        out = self.image_processor(images=[[im.convert("RGB") for im in ims] for ims in per_row], return_tensors="pt")
        # only what the processor itself hands the model (Gemma's image processor also returns num_crops)
        return {k: v for k, v in out.items() if torch.is_tensor(v) and k in self._probe().input_keys}

    def per_token_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-token inputs the model takes besides ids and attention (e.g. Qwen's mm_token_type_ids), derived
        from the ids as the processor derives them."""
        out = {}
        for key, values in self._probe().per_token.items():
            t = torch.zeros_like(input_ids)
            for token, value in values.items():
                t[input_ids == token] = value
            out[key] = t
        return out

    def assemble(self, rows: list[list[int]], images: list[list[Image.Image]], padding_side: str = "right",
                 attention: list[list[int]] | None = None) -> dict[str, torch.Tensor]:
        """Model inputs for token sequences assembled outside the processor (placeholders already expanded by
        `expand`): padded ids and attention, per-token inputs, and the vision inputs of each row's images."""
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            sl = slice(0, len(r)) if padding_side == "right" else slice(width - len(r), width)
            input_ids[i, sl] = torch.tensor(r, dtype=torch.long)
            attn[i, sl] = torch.tensor(attention[i], dtype=torch.long) if attention is not None else 1
        vision = self.vision_inputs(images)
        if not vision:  # text only, as `_call` returns it
            return {"input_ids": input_ids, "attention_mask": attn}
        return {"input_ids": input_ids, "attention_mask": attn, **self.per_token_inputs(input_ids), **vision}

    def extend_inputs(self, prompt_batch: dict[str, torch.Tensor], sequences: torch.Tensor,
                      completion_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Model inputs for prompt + completion from the prompt batch (left-padded) that generated it: the
        prompt's vision inputs, per-token inputs over the whole sequence."""
        out = {k: v for k, v in prompt_batch.items() if k not in ("input_ids", "attention_mask", "answer_mask")
               and k not in self._probe().per_token}
        out["input_ids"] = sequences
        out["attention_mask"] = torch.cat([prompt_batch["attention_mask"], completion_mask], dim=1)
        if any(k in prompt_batch for k in self._probe().per_token):  # prompts with images
            out.update(self.per_token_inputs(sequences))
        return out

    def select_rows(self, batch: dict[str, torch.Tensor], images: list, order: list[int]) -> dict[str, torch.Tensor]:
        """The batch's rows in `order` (a row may repeat: G samples of one prompt), vision inputs included.

        `images[i]` are row i's images. Vision inputs are selected image by image where the family's layout
        says which entries belong to which image: a first dimension that counts images (LLaVA, Gemma), or
        rows (SmolVLM), or patches with a grid per image (the Qwen-VL family's `image_grid_thw`). Any other
        layout is computed again by the image processor for the selected rows."""
        per_row = self.image_lists(images)
        B = batch["input_ids"].shape[0]
        counts = [len(ims) for ims in per_row]
        n_images = sum(counts)
        first = [sum(counts[:i]) for i in range(B)]
        image_order = [first[r] + j for r in order for j in range(counts[r])]
        row_keys = self.row_keys()
        out, recompute = {}, False
        for key, value in batch.items():
            if key in row_keys:
                out[key] = value[order]
            elif key == "pixel_values" and "image_grid_thw" in batch:
                patches = value.split(batch["image_grid_thw"].prod(dim=-1).tolist())
                out[key] = torch.cat([patches[i] for i in image_order]) if image_order else value[:0]
            elif value.dim() and value.shape[0] == n_images:
                out[key] = value[image_order]
            elif value.dim() and value.shape[0] == B:
                out[key] = value[order]
            else:
                recompute = True
        if recompute:
            rows = {k: out[k] for k in out if k in row_keys}
            return {**rows, **self.vision_inputs([per_row[r] for r in order])}
        return out

    def trimmed(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch without the columns every row pads, before its first and after its last attended one: a
        micro-batch of short rows then costs its own width. Padding is masked out of attention, so no real
        token's output changes (Trajectory.trimmed, for scored rows)."""
        cols = batch["attention_mask"].bool().any(dim=0).nonzero().flatten()
        if not len(cols) or (int(cols[0]) == 0 and int(cols[-1]) == batch["attention_mask"].shape[1] - 1):
            return batch
        keys, keep = self.row_keys(), slice(int(cols[0]), int(cols[-1]) + 1)
        return {k: (v[:, keep] if k in keys else v) for k, v in batch.items()}

    def row_keys(self) -> set[str]:
        """The model inputs laid out [rows, tokens]: what a micro-batch's rows and columns are cut from."""
        return {"input_ids", "attention_mask", "answer_mask", *self._probe().per_token}

    def repeat_rows(self, batch: dict[str, torch.Tensor], images: list, times: int) -> dict[str, torch.Tensor]:
        """Each row `times` in a row, as generate(num_return_sequences=times) lays out its samples."""
        return self.select_rows(batch, images, [r for r in range(batch["input_ids"].shape[0]) for _ in range(times)])

    # ------------------------------------------------------------------ the probes

    def _probe(self) -> _Probed:
        if self._probed is None:
            self._probed = self._read_probes()
        return self._probed

    def _read_probes(self) -> _Probed:
        tok = self.tokenizer
        # the end-of-turn text: what the template writes after an assistant answer, through its stop token
        stops = [t for t in [*self._generation_eos, tok.eos_token_id] if t is not None]
        conv = [self.user_message(PROBE_TEXT), {"role": "assistant", "content": [{"type": "text",
                                                                                   "text": PROBE_ANSWER}]}]
        full = self.render(conv, add_generation_prompt=False)
        after = full[full.rfind(PROBE_ANSWER) + len(PROBE_ANSWER):] if PROBE_ANSWER in full else ""
        stop_strings = {tok.convert_ids_to_tokens(t): t for t in stops}
        ends = [(after.find(s), s) for s in stop_strings if s and s in after]
        if ends:
            pos, s = min(ends)
            end_of_turn, eos_id = after[:pos + len(s)], stop_strings[s]
        else:
            if tok.eos_token is None:
                raise CheckpointError(f"{self.source}: the chat template ends an assistant turn with no stop token "
                                      "and the tokenizer has no eos token")
            end_of_turn, eos_id = tok.eos_token, tok.eos_token_id
        stop_ids = list(dict.fromkeys([eos_id, *stops]))
        # tokens placed around images: in the rendered or expanded prompt with an image, not in the one without
        special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
        with_image, without = self.prompt(PROBE_TEXT, 1), self.prompt(PROBE_TEXT, 0)
        image = _probe_image(_probe_size(self.image_processor))
        probe = self._call([with_image], [[image]], "right")
        plain = set(tok(without, add_special_tokens=False)["input_ids"])
        rendered = set(tok(with_image, add_special_tokens=False)["input_ids"])
        expanded = probe["input_ids"][0].tolist()
        placed = sorted(((rendered | set(expanded)) - plain) & special | {self.image_token_id})
        video = getattr(self.processor, "video_token_id", None)
        if isinstance(video, int):
            placed = sorted(set(placed) | {video})
        # per-token inputs: tensors shaped like input_ids; their values as a function of the token id
        per_token = {}
        ids = probe["input_ids"][0]
        for key, value in probe.items():
            if key in ("input_ids", "attention_mask") or tuple(value.shape) != tuple(probe["input_ids"].shape):
                continue
            mapping: dict[int, int] = {}
            for t, v in zip(ids.tolist(), value[0].tolist()):
                if v:
                    if mapping.get(t, v) != v:
                        raise CheckpointError(f"{self.source}: the processor's '{key}' is not a function of the "
                                              "token id; protege cannot rebuild it for sequences it assembles")
                    mapping[t] = int(v)
            per_token[key] = mapping
        return _Probed(end_of_turn, eos_id, stop_ids, [t for t in placed if t not in stop_ids], per_token, set(probe))


def _probe_size(image_processor) -> int:
    size = getattr(image_processor, "size", None)
    for key in ("height", "shortest_edge", "longest_edge"):
        value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
        if isinstance(value, int) and 0 < value <= 1024:
            return value
    return 64


def _generation_eos(path: Path) -> list[int]:
    f = Path(path) / "generation_config.json"
    if not f.is_file():
        return []
    try:
        eos = json.loads(f.read_text(encoding="utf-8")).get("eos_token_id")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return []
    if isinstance(eos, int):
        return [eos]
    return [e for e in eos if isinstance(e, int)] if isinstance(eos, list) else []

