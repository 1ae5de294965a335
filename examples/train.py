"""Trains a small model for a few steps (on the CPU, or --device cuda): the GPT of tiny_gpt.py with
AdamW (some blocks under activation checkpointing), the residual convnet of tiny_convnet.py or
the ResNet-18 layout of tiny_resnet.py (BatchNorm; its blocks in four containers) with SGD +
momentum, or (torch 2, with the `transformers` library) a GPT-2 of the `transformers`
library built from a small config, with AdamW and its own activation-checkpointing switch, a
T5 of that library (an encoder and a decoder stack) or a Llama (rotary position embeddings
handed to every layer; its own checkpointing switch too) with AdamW.
Nothing here knows about tidemark, except --plan, which applies a recompute plan the way a user
would (tidemark.apply_plan). Run it under `tidemark run` to profile it.

    tidemark run -- python3 examples/train.py --steps 4
    tidemark run -- python3 examples/train.py --model convnet --checkpoint '' --plan plan.json
    tidemark run -- python3 examples/train.py --model convnet --checkpoint-sequential 3
    tidemark run -- python examples/train.py --model gpt2 --checkpoint all
    tidemark run -- python examples/train.py --checkpoint '' --compile --plan plan.json
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def build_gpt2(args):
    """A GPT-2 of the `transformers` library, from a config (nothing downloaded)."""
    try:
        import transformers
    except ImportError:
        raise SystemExit("--model gpt2 needs the transformers library (scripts/install-deps.sh "
                         "puts it in the torch 2 environment)")
    config = transformers.GPT2Config(vocab_size=256, n_positions=args.seq_len, n_embd=args.d_model,
                                     n_layer=args.layers, n_head=4, bos_token_id=0,
                                     eos_token_id=0, use_cache=False)
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # what it falls back to anyway, without a warning
    return own_checkpointing(model, args)


def own_checkpointing(model, args):
    """The model's own switch, on for --checkpoint: every layer checkpointed (non-reentrant by
    default)."""
    if args.checkpoint:
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
    return model


def build_t5(args):
    """A T5 of the `transformers` library (an encoder and a decoder stack), from a config."""
    try:
        import transformers
    except ImportError:
        raise SystemExit("--model t5 needs the transformers library (scripts/install-deps.sh "
                         "puts it in the torch 2 environment)")
    config = transformers.T5Config(vocab_size=256, d_model=args.d_model, d_ff=4 * args.d_model,
                                   num_layers=args.layers, num_decoder_layers=args.layers,
                                   num_heads=4, d_kv=args.d_model // 4, decoder_start_token_id=0,
                                   use_cache=False)
    return transformers.T5ForConditionalGeneration(config)


def build_llama(args):
    """A Llama of the `transformers` library (rotary position embeddings made once and handed to
    every decoder layer), from a config."""
    try:
        import transformers
    except ImportError:
        raise SystemExit("--model llama needs the transformers library (scripts/install-deps.sh "
                         "puts it in the torch 2 environment)")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=args.d_model,
                                      intermediate_size=4 * args.d_model,
                                      num_hidden_layers=args.layers, num_attention_heads=4,
                                      num_key_value_heads=4,
                                      max_position_embeddings=args.seq_len, bos_token_id=0,
                                      eos_token_id=0, pad_token_id=0, use_cache=False)
    model = transformers.LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"
    return own_checkpointing(model, args)


def build(args):
    """(model, optimizer, make_batch(gen) -> (inputs, targets), loss(model, inputs, targets))."""
    import tiny_gpt  # the token batches of the text models
    if args.model == "t5":
        if args.checkpoint:
            raise SystemExit("--checkpoint applies to the gpt models only")
        model = build_t5(args)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        # A sequence-to-sequence copy of the reversed input.
        return (model, opt, lambda g: tiny_gpt.make_batch(g, args.batch, args.seq_len, 256),
                lambda m, x, y: m(input_ids=x, labels=x.flip(1)).loss)
    if args.model in ("gpt2", "llama"):
        model = build_gpt2(args) if args.model == "gpt2" else build_llama(args)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        # The model shifts the labels itself: the inputs are the labels.
        return (model, opt, lambda g: tiny_gpt.make_batch(g, args.batch, args.seq_len, 256),
                lambda m, x, y: m(input_ids=x, labels=x).loss)
    ckpt = tuple(int(i) for i in args.checkpoint.split(",") if i != "")
    if args.model == "gpt":
        model = tiny_gpt.TinyGPT(d_model=args.d_model, n_layers=args.layers, seq_len=args.seq_len,
                                 checkpointed=ckpt, checkpoint_form=args.checkpoint_form)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        return (model, opt, lambda g: tiny_gpt.make_batch(g, args.batch, args.seq_len, 256),
                lambda m, x, y: m(x, y))
    import tiny_convnet
    if ckpt:
        raise SystemExit("--checkpoint applies to the gpt models only")
    if args.model == "resnet":
        import tiny_resnet
        model = tiny_resnet.ResNet()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return (model, opt, lambda g: tiny_convnet.make_batch(g, args.batch, image=64),
                lambda m, x, y: m(x, y))
    model = tiny_convnet.TinyConvNet(checkpoint_segments=args.checkpoint_sequential)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return (model, opt, lambda g: tiny_convnet.make_batch(g, args.batch),
            lambda m, x, y: m(x, y))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=("gpt", "convnet", "resnet", "gpt2", "t5", "llama"),
                   default="gpt")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, help="batch size (default: gpt 8, convnet and resnet 16)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--checkpoint", default="1,3,5",
                   help="gpt: comma-separated block indices to checkpoint ('' for none); "
                        "gpt2, llama: anything but '' checkpoints every layer (its own switch)")
    p.add_argument("--checkpoint-form", choices=("module", "closure"), default="module",
                   help="gpt: the checkpoint is handed the block (module, the default) or a "
                        "function that calls it (closure, as older transformers models did)")
    p.add_argument("--checkpoint-sequential", type=int, default=0, metavar="N",
                   help="convnet: its blocks through torch's checkpoint_sequential in N segments")
    p.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="micro-batches per optimizer step (gradient accumulation; default 1)")
    p.add_argument("--closure", action="store_true",
                   help="the forward and backward run in a closure handed to optimizer.step "
                        "(as LBFGS needs and PyTorch Lightning's training loop does)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", help="apply this tidemark recompute plan (plan.json) before training")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--compile", action="store_true",
                   help="torch 2: train the whole model under torch.compile (after --plan: its "
                        "checkpoint regions are compiled with the model)")
    p.add_argument("--activation-memory-budget", type=float, metavar="F",
                   help="with --compile: torch._functorch.config.activation_memory_budget, "
                        "torch.compile's own recomputation (1.0: its default; 0: recompute "
                        "what it can)")
    p.add_argument("--torch-profiler", action="store_true",
                   help="run the steps under torch.profiler and print its count of GPU kernels")
    args = p.parse_args(argv)
    if args.activation_memory_budget is not None and not args.compile:
        p.error("--activation-memory-budget is torch.compile's: it needs --compile")
    if args.model != "gpt" and args.checkpoint == "1,3,5":
        args.checkpoint = ""  # the default belongs to the gpt
    if args.batch is None:
        args.batch = 16 if args.model in ("convnet", "resnet") else 8

    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model, opt, make_batch, compute_loss = build(args)
    device = torch.device(args.device)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print("model: %s, %d parameters, %d bytes; checkpointed blocks: %s"
          % (args.model, n_params, sum(p.numel() * p.element_size() for p in model.parameters()),
             args.checkpoint or "none"), flush=True)
    if args.plan:
        import tidemark
        applied = tidemark.apply_plan(model, args.plan)
        print("plan: %s; %s" % (applied.plan["strategy"], ", ".join(
            "%s %s" % (s["mode"], "..".join(s["modules"][::max(1, len(s["modules"]) - 1)]))
            for s in applied.plan["segments"] if s["mode"] != "store") or "store everything"),
            flush=True)
    forward = model
    if args.compile:
        if not hasattr(torch, "compile"):
            raise SystemExit("--compile needs torch 2 (this torch is %s)" % torch.__version__)
        if args.activation_memory_budget is not None:
            from torch._functorch import config as functorch_config
            functorch_config.activation_memory_budget = args.activation_memory_budget
        forward = torch.compile(model)
    gen = torch.Generator().manual_seed(args.seed)
    profiler = None
    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        profiler = profile(activities=activities)
        profiler.__enter__()
    for step in range(1, args.steps + 1):
        batches = [[t.to(device) for t in make_batch(gen)] for _ in range(args.accumulate)]
        t0 = time.perf_counter()

        def forward_and_backward():
            opt.zero_grad()
            for inputs, targets in batches:
                loss = compute_loss(forward, inputs, targets)
                (loss / args.accumulate if args.accumulate > 1 else loss).backward()
            return loss

        if args.closure:
            loss = opt.step(forward_and_backward)
        else:
            loss = forward_and_backward()
            opt.step()
        print("step %d loss %.6f (%.0f ms)" % (step, loss.item(), 1e3 * (time.perf_counter() - t0)),
              flush=True)
    if profiler is not None:
        profiler.__exit__(None, None, None)
        gpu = [e.name for e in profiler.events() if e.device_type.name == "CUDA"]
        copies = sum(1 for n in gpu if n.startswith(("Memcpy", "Memset")))
        print("torch.profiler: %d GPU kernels, %d copies and fills" % (len(gpu) - copies, copies),
              flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
        print("cuda: max_memory_allocated %d, max_memory_reserved %d"
              % (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()), flush=True)
    # What the optimizer holds at the end, counted by storage (for `tidemark attach`'s tests).
    storages = {}
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                s = v.untyped_storage() if hasattr(v, "untyped_storage") else v.storage()
                n = s.nbytes() if hasattr(s, "nbytes") else s.size() * s.element_size()
                storages[s.data_ptr()] = n
    print("optimizer state: %d bytes" % sum(storages.values()), flush=True)


if __name__ == "__main__":
    main()
