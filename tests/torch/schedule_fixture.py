"""schedule_fixture.py — PyTorch's learning rate per optimizer step, for --schedule const|cosine and
--warmup-steps.

    python3 tests/torch/schedule_fixture.py > tests/fixtures/schedule.txt

Drives torch.optim.SGD with torch.optim.lr_scheduler.CosineAnnealingLR(T_max = the run's steps,
eta_min = 0) — or no scheduler, for const — stepping the scheduler once per optimizer step, as
stages 1–5 do, and records the lr each optimizer step uses. With a warm-up of W steps from factor F,
the scheduler is SequentialLR([LinearLR(start_factor=F, total_iters=W), CosineAnnealingLR(T_max =
TOTAL_STEPS − W)], milestones=[W]) — LinearLR alone for const — as torchvision's reference scripts
build it for --lr-warmup-epochs. One line per case:
    SCHEDULE TOTAL_STEPS LR: lr(step 0) lr(step 1) ... lr(step TOTAL_STEPS)   (%.17g)
where SCHEDULE is const, cosine, or e.g. cosine+warmup=3,0.25 (W, then repr(F)).
PyTorch updates the cosine recursively (one factor per step); optim.c evaluates the closed form, so
tests/test_e2e.c compares each value to a relative 1e-12, not bit for bit.
"""
import torch

CASES = [  # schedule, total steps, lr, warm-up steps, start factor
    ("cosine", 9, 0.1, 0, 0),      # tests/test_e2e.c's run: 3 epochs × 3 steps
    ("cosine", 7, 0.3, 0, 0),
    ("cosine", 391, 0.1, 0, 0),    # one CIFAR-10 epoch at batch 128
    ("const", 5, 0.05, 0, 0),
    ("cosine", 9, 0.1, 3, 0.25),
    ("cosine", 391, 0.4, 50, 0.01),  # 2 GPUs × batch 128 × 2 micro-batches: lr 4 × 0.1, warmed up
    ("const", 6, 0.05, 2, 0.5),
]

print("# schedule TOTAL_STEPS LR: the lr of optimizer steps 0..TOTAL_STEPS, from torch " + torch.__version__)
for schedule, total, lr, warmup, factor in CASES:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr, momentum=0.9)
    S = torch.optim.lr_scheduler
    if warmup:
        warm = S.LinearLR(opt, start_factor=factor, end_factor=1.0, total_iters=warmup)
        sched = (S.SequentialLR(opt, [warm, S.CosineAnnealingLR(opt, T_max=total - warmup)], milestones=[warmup])
                 if schedule == "cosine" else warm)
        name = f"{schedule}+warmup={warmup},{factor!r}"
    else:
        sched = S.CosineAnnealingLR(opt, T_max=total) if schedule == "cosine" else None
        name = schedule
    out = []
    for step in range(total + 1):
        out.append(opt.param_groups[0]["lr"])  # the lr this optimizer step uses
        p.grad = torch.ones(1)
        opt.step()
        if sched is not None:
            sched.step()
    print(f"{name} {total} {lr!r}: " + " ".join("%.17g" % v for v in out))
