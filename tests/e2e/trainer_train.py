"""A training run by the `transformers` library's Trainer (torch 2), as users write one: a GPT-2
from a small config (nothing downloaded), its own gradient checkpointing, gradient accumulation
over two micro-batches, AdamW with a warm-up schedule, clipping, an evaluation pass every 4 steps
and a checkpoint saved to disk with it. For test_torch2_forms.TrainerTest; runs under `tidemark
run` and never imports tidemark. Its ground truth, computed here: the bytes of the weights, of the
optimizer's state and of the trained parameters' gradients, and how many forwards ran in training
and in evaluation (counted by a hook of its own)."""
import argparse
import json
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from truth_train import storage


class CountingTokens(torch.utils.data.Dataset):
    """Sequences that count up modulo the vocabulary from a random start."""

    def __init__(self, n, seq_len, vocab, seed):
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=gen)
        self.tokens = (start + torch.arange(seq_len)) % vocab

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def unique_bytes(tensors):
    return sum(dict(storage(t) for t in tensors).values())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=128, n_layer=4, n_head=4,
                        use_cache=False)
    model = GPT2LMHeadModel(config)
    forwards = {"train": 0, "eval": 0}

    def count(module, _inputs):
        forwards["train" if module.training else "eval"] += 1

    model.register_forward_pre_hook(count)
    training = TrainingArguments(
        output_dir=args.dir, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        gradient_accumulation_steps=2, max_steps=args.steps, learning_rate=1e-3, warmup_steps=2,
        max_grad_norm=1.0, gradient_checkpointing=True, eval_strategy="steps", eval_steps=4,
        save_strategy="steps", save_steps=4, logging_steps=1, report_to=[], use_cpu=True,
        dataloader_num_workers=0, bf16=args.bf16, disable_tqdm=True)
    trainer = Trainer(model=model, args=training,
                      train_dataset=CountingTokens(128, 64, 256, seed=1),
                      eval_dataset=CountingTokens(16, 64, 256, seed=2))
    trainer.train()
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    trained = [q for q in model.parameters() if q.requires_grad]
    truth = {"weight_bytes": unique_bytes(list(model.parameters()) + list(model.buffers())),
             "gradient_bytes": unique_bytes(trained),
             "optimizer_bytes": unique_bytes(state), "forwards": forwards,
             "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
             "checkpoints": sorted(d for d in os.listdir(args.dir) if d.startswith("checkpoint-"))}
    with open(args.out, "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main()
