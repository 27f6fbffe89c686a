"""Scripted CNNs: `nncfuse.jit(module)` (the module scripted, its shape checks and all)
against the same module traced, eager and torch.compile, 1 thread, inference.

    python benchmarks/scripted_cnn.py --quick --clock cpu
    python benchmarks/scripted_cnn.py --dtype bfloat16          # under torch.autocast

Two small models of torchvision's shapes, written here because transformers' ResNet and
MobileNetV2 do not script: a ResNet-18-like net (Conv2d, BatchNorm2d, ReLU, residual adds,
MaxPool2d, AdaptiveAvgPool2d) and a MobileNetV2-like one (1x1 expansions, depthwise 3x3
convolutions, BatchNorm2d, ReLU6, residual adds). Scripted, every BatchNorm2d checks its
input's rank first (`_check_input_dim`); nncfuse's groups hold such checks
(`tensorexpr/shape_checks.py`), so each convolution fuses with its batch norm as it does
traced. Contenders run side by side in one process, interleaved rounds, medians
(`harness.measure`); each is checked against eager first. Coverage and groups are
`nncfuse.explain`'s.
"""


import argparse

import torch
from harness import fmt_time, measure
from torch import nn

import nncfuse


def _conv(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)


class ResNetish(nn.Module):
    """ResNet-18's layers, one BasicBlock per stage: the block's layers are kept in lists of
    the top module, whose forward calls each, so that every BatchNorm2d keeps its check (a
    batch norm that a submodule's forward calls loses it: TorchScript's inliner drops the
    check, so torchvision's scripted ResNet checks only its first batch norm)."""

    def __init__(self, widths: tuple[int, ...] = (64, 128, 256, 512)):
        super().__init__()
        self.conv1, self.bn1 = _conv(3, widths[0], 7, 2), nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        w0 = widths[0]  # the first stage: the shortcut is the identity
        self.conv_a0, self.bn_a0 = _conv(w0, w0, 3), nn.BatchNorm2d(w0)
        self.conv_b0, self.bn_b0 = _conv(w0, w0, 3), nn.BatchNorm2d(w0)
        pairs = list(zip(widths[:-1], widths[1:]))  # the others halve the image
        self.convs_a = nn.ModuleList(_conv(i, w, 3, 2) for i, w in pairs)
        self.bns_a = nn.ModuleList(nn.BatchNorm2d(w) for _, w in pairs)
        self.convs_b = nn.ModuleList(_conv(w, w, 3) for _, w in pairs)
        self.bns_b = nn.ModuleList(nn.BatchNorm2d(w) for _, w in pairs)
        self.convs_down = nn.ModuleList(_conv(i, w, 1, 2) for i, w in pairs)
        self.bns_down = nn.ModuleList(nn.BatchNorm2d(w) for _, w in pairs)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        y = self.bn_b0(self.conv_b0(self.relu(self.bn_a0(self.conv_a0(x)))))
        x = self.relu(y + x)
        for conv_a, bn_a, conv_b, bn_b, conv_down, bn_down in zip(
                self.convs_a, self.bns_a, self.convs_b, self.bns_b, self.convs_down,
                self.bns_down):
            y = bn_b(conv_b(self.relu(bn_a(conv_a(x)))))
            x = self.relu(y + bn_down(conv_down(x)))
        return torch.flatten(self.pool(x), 1)


class MobileNetish(nn.Module):
    """MobileNetV2's inverted residuals (1x1 expansion, depthwise 3x3, 1x1 projection, each
    with a batch norm, ReLU6 between), its layers in lists of the top module (see
    `ResNetish`)."""

    __constants__ = ["residual"]  # (a constant: the adds' branches fold away)

    def __init__(self, settings: tuple[tuple[int, int, int], ...] = (
            (16, 1, 1), (24, 2, 6), (24, 1, 6), (32, 2, 6), (32, 1, 6), (64, 2, 6), (64, 1, 6))):
        super().__init__()
        self.conv1, self.bn1 = _conv(3, 16, 3, 2), nn.BatchNorm2d(16)
        self.relu6 = nn.ReLU6()
        layers: list[list[nn.Module]] = [[] for _ in range(6)]
        residual = []
        cin = 16
        for cout, stride, expand in settings:
            hidden = cin * expand
            for k, m in enumerate((
                    _conv(cin, hidden, 1), nn.BatchNorm2d(hidden),
                    _conv(hidden, hidden, 3, stride, groups=hidden), nn.BatchNorm2d(hidden),
                    _conv(hidden, cout, 1), nn.BatchNorm2d(cout))):
                layers[k].append(m)
            residual.append(stride == 1 and cin == cout)
            cin = cout
        self.residual = tuple(residual)
        self.expand, self.bn_expand, self.depthwise, self.bn_depthwise, self.project, \
            self.bn_project = (nn.ModuleList(group) for group in layers)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu6(self.bn1(self.conv1(x)))
        k = 0
        for expand, bn_expand, depthwise, bn_depthwise, project, bn_project in zip(
                self.expand, self.bn_expand, self.depthwise, self.bn_depthwise, self.project,
                self.bn_project):
            y = self.relu6(bn_expand(expand(x)))
            y = bn_project(project(self.relu6(bn_depthwise(depthwise(y)))))
            x = x + y if self.residual[k] else y
            k += 1
        return torch.flatten(self.pool(x), 1)


MODELS = {"resnet": ResNetish, "mobilenet": MobileNetish}


def _randomize_batch_norms(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)


def run(name: str, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    size = 64 if args.quick else 224
    x = torch.randn(1, 3, size, size)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")
    with torch.no_grad():  # (the trace made in float32, as `models.py` makes it)
        _randomize_batch_norms(model)
        fns = {"eager": model}
        if "nncfuse-script" in args.contenders:
            fns["nncfuse-script"] = nncfuse.jit(model)
        if "nncfuse-trace" in args.contenders:
            fns["nncfuse-trace"] = nncfuse.jit(torch.jit.trace(model, x))
        if "compile" in args.contenders:
            fns["compile"] = torch.compile(model)
    with torch.no_grad(), autocast:
        want = model(x)
        tol = 2e-2 if args.dtype == "bfloat16" else 1e-4
        for fn in fns.values():
            for _ in range(3):
                fn(x)
            torch.testing.assert_close(fn(x), want, rtol=tol, atol=tol)
        timings = measure({k: (lambda fn=fn: fn(x)) for k, fn in fns.items()},
                          rounds=args.rounds, clock=args.clock)
        eager = timings["eager"].median
        print(f"{name} ({args.dtype}, {size}x{size}, {args.clock} time, 1 thread)")
        for k, t in timings.items():
            cover = ""
            if k.startswith("nncfuse"):
                rep = nncfuse.explain(fns[k], x)
                cover = (f"  coverage {rep.fused_nodes}/{rep.compute_nodes} "
                         f"({100 * rep.coverage:.0f}%), {len(rep.groups)} groups, "
                         f"{rep.external_nodes} external outside")
            print(f"  {k:15s} {fmt_time(t.median)}  x{eager / t.median:5.2f} vs eager{cover}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet,mobilenet")
    p.add_argument("--contenders", default="nncfuse-script,nncfuse-trace,compile")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="64x64 images, 5 rounds")
    args = p.parse_args()
    args.rounds = args.rounds or (5 if args.quick else 15)
    torch.set_num_threads(1)
    for name in args.models.split(","):
        run(name, args)


if __name__ == "__main__":
    main()
