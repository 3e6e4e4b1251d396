"""models.py — the PyTorch twins of common/model.c's ResNets (same layers, same state_dict order).

Used by make_fixtures.py (outside oracle for the C code) and bench_pytorch.py (the baseline).
The CIFAR ResNet-18 is the widely used variant: 3x3 stem, no max-pool, BasicBlocks [2,2,2,2],
widths 64-128-256-512, global average pool, linear. `tiny` is 16 -> 32 -> 64 with one block per
stage, each block halving the resolution. norm=False drops every BatchNorm (--norm none).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout) if norm else nn.Identity()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout) if norm else nn.Identity()
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            mods = [nn.Conv2d(cin, cout, 1, stride, bias=False)]
            if norm:
                mods.append(nn.BatchNorm2d(cout))
            self.shortcut = nn.Sequential(*mods)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, arch="resnet18", norm=True, classes=10):
        super().__init__()
        if arch == "resnet18":
            stem, plan = 64, [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]
            names = ["layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer4.0", "layer4.1"]
        elif arch == "tiny":
            stem, plan = 16, [(32, 2), (64, 2)]
            names = ["layer1.0", "layer2.0"]
        else:
            raise ValueError(arch)
        self.conv1 = nn.Conv2d(3, stem, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem) if norm else nn.Identity()
        cin = stem
        layers = {}
        for (cout, stride), name in zip(plan, names):
            layers.setdefault(name.split(".")[0], []).append(BasicBlock(cin, cout, stride, norm))
            cin = cout
        for lname, blocks in layers.items():
            setattr(self, lname, nn.Sequential(*blocks))
        self.layer_names = list(layers)
        self.linear = nn.Linear(cin, classes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        for name in self.layer_names:
            out = getattr(self, name)(out)
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)
