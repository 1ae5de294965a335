"""A small residual convolutional network for the CPU, structurally unlike tiny_gpt.py: its blocks
are heterogeneous (channels double and the resolution halves every four blocks), so they differ in
time, saved activations and output size, which is where an optimal recompute plan beats the
uniform ones.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ResBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(4, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(4, c_out)
        self.skip = (nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
                     if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x):
        h = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(h)) + self.skip(x))


class TinyConvNet(nn.Module):
    def __init__(self, width=16, image=32, classes=10, checkpoint_segments=0):
        super().__init__()
        # > 0: in training, the blocks run through torch's checkpoint_sequential in this many
        # segments (each but the last re-run in the backward).
        self.checkpoint_segments = checkpoint_segments
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        plan = []
        for stage, c in enumerate((width, 2 * width, 4 * width)):
            for k in range(4):
                c_in = c if stage == 0 or k > 0 else c // 2
                plan.append((c_in, c, 2 if stage > 0 and k == 0 else 1))
        self.blocks = nn.ModuleList(ResBlock(i, o, s) for i, o, s in plan)
        self.head = nn.Linear(4 * width, classes)

    def forward(self, images, targets):
        x = F.relu(self.stem(images))
        if self.checkpoint_segments and self.training:
            import inspect
            from torch.utils.checkpoint import checkpoint_sequential
            # Non-reentrant where torch has it (2.x); torch 1.13's is reentrant.
            options = ({"use_reentrant": False} if "use_reentrant" in
                       inspect.signature(checkpoint_sequential).parameters else {})
            x = checkpoint_sequential(list(self.blocks), self.checkpoint_segments, x, **options)
        else:
            for block in self.blocks:
                x = block(x)
        logits = self.head(x.mean(dim=(2, 3)))
        return F.cross_entropy(logits, targets)


def make_batch(gen, batch, image=32, classes=10):
    """Synthetic images whose class is the brightest of ten fixed patterns."""
    targets = torch.randint(0, classes, (batch,), generator=gen)
    images = torch.randn(batch, 3, image, image, generator=gen) * 0.5
    images[:, 0, :, :] += targets.view(-1, 1, 1).float() / classes
    return images, targets
