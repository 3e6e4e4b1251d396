"""schedule_fixture.py — PyTorch's learning rate per optimizer step, for --schedule const|cosine.

    python3 tests/torch/schedule_fixture.py > tests/fixtures/schedule.txt

Drives torch.optim.SGD with torch.optim.lr_scheduler.CosineAnnealingLR(T_max = the run's steps,
eta_min = 0) — or no scheduler, for const — stepping the scheduler once per optimizer step, as
stages 1–5 do, and records the lr each optimizer step uses. One line per case:
    SCHEDULE TOTAL_STEPS LR: lr(step 0) lr(step 1) ... lr(step TOTAL_STEPS)   (%.17g)
PyTorch updates the cosine recursively (one factor per step); optim.c evaluates the closed form, so
tests/test_e2e.c compares each value to a relative 1e-12, not bit for bit.
"""
import torch

CASES = [
    ("cosine", 9, 0.1),      # tests/test_e2e.c's run: 3 epochs × 3 steps
    ("cosine", 7, 0.3),
    ("cosine", 391, 0.1),    # one CIFAR-10 epoch at batch 128
    ("const", 5, 0.05),
]

print("# schedule TOTAL_STEPS LR: the lr of optimizer steps 0..TOTAL_STEPS, from torch " + torch.__version__)
for schedule, total, lr in CASES:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total) if schedule == "cosine" else None
    out = []
    for step in range(total + 1):
        out.append(opt.param_groups[0]["lr"])  # the lr this optimizer step uses
        p.grad = torch.ones(1)
        opt.step()
        if sched is not None:
            sched.step()
    print(f"{schedule} {total} {lr!r}: " + " ".join("%.17g" % v for v in out))
