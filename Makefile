# Makefile — builds every stage (./stage1 …) and the test runner; `make help` lists the targets.
#
# CUDA is found through CUDA_HOME (default /usr/local/cuda); cuDNN and NCCL through CUDNN_HOME /
# NCCL_HOME or the usual system directories. Without a CUDA toolkit (or with CPU_ONLY=1) only the
# CPU backend is built, and every binary still runs. CUDA_ARCH=90 (or "80 90") overrides the GPU
# architectures; by default we build for the visible GPUs, or for Turing…Hopper plus PTX.

# CFLAGS / LDFLAGS are the user's (`make CFLAGS="-O0 -g -fsanitize=address"` replaces only them);
# the flags the build needs live in ALL_CFLAGS, which always adds them first.
# gcc unless CC is given (command line, environment): make predefines CC=cc, so `CC ?= gcc` never applied.
ifeq ($(origin CC),default)
  CC     := gcc
endif
# The compiler's target (x86_64-linux-gnu, aarch64-linux-gnu, …): its library directory is searched
# first for the static archives below, so that a cross build (CC=aarch64-linux-gnu-gcc) links its own.
LIB_TRIPLE := $(shell $(CC) -dumpmachine 2>/dev/null)
LIB_OWN    = $(if $(LIB_TRIPLE),/usr/lib/$(LIB_TRIPLE)/$(1))
CFLAGS   ?= -O3 -g
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -pthread -Icommon \
             $(CUDA_CFLAGS) -MMD -MP $(CFLAGS)
LDLIBS    = -lm -lpthread
CUDA_HOME ?= /usr/local/cuda
NVCC     := $(CUDA_HOME)/bin/nvcc

ifeq ($(CPU_ONLY),1)
  HAVE_CUDA :=
else
  HAVE_CUDA := $(shell test -x $(NVCC) && echo 1)
endif

, := ,
# first directory of a list that holds a given file
find_dir = $(firstword $(foreach d,$(2),$(if $(wildcard $(d)/$(1)),$(d))))

SYS_INC := /usr/include /usr/local/include /usr/include/x86_64-linux-gnu /usr/include/aarch64-linux-gnu
# /usr/local/lib64 too: where the linker looks by default (ld --verbose), so a library found only there
# (NCCL, say) linked while the build line said it was missing.
SYS_LIB := /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib64 /usr/local/lib

ifeq ($(HAVE_CUDA),1)
  CUDNN_INC := $(call find_dir,cudnn.h,$(if $(CUDNN_HOME),$(CUDNN_HOME)/include) $(CUDA_HOME)/include $(SYS_INC))
  CUDNN_LIB := $(call find_dir,libcudnn.so,$(if $(CUDNN_HOME),$(CUDNN_HOME)/lib64 $(CUDNN_HOME)/lib) $(CUDA_HOME)/lib64 $(SYS_LIB))
  NCCL_INC  := $(call find_dir,nccl.h,$(if $(NCCL_HOME),$(NCCL_HOME)/include) $(CUDA_HOME)/include $(SYS_INC))
  NCCL_DIRS := $(if $(NCCL_HOME),$(NCCL_HOME)/lib64 $(NCCL_HOME)/lib) $(CUDA_HOME)/lib64 $(SYS_LIB)
  NCCL_LIB  := $(call find_dir,libnccl.so,$(NCCL_DIRS))
  # pip's nvidia-nccl ships libnccl.so.2 alone (no libnccl.so link): linked by its file name, -l:libnccl.so.2
  NCCL_SO2  := $(if $(NCCL_LIB),,$(call find_dir,libnccl.so.2,$(NCCL_DIRS)))
  ifeq ($(CUDNN_INC),)
    $(error CUDA found at $(CUDA_HOME) but no cudnn.h: install cuDNN 9, set CUDNN_HOME, or build with CPU_ONLY=1)
  endif
  # Architectures: the visible GPUs', else every one from Turing to Hopper this nvcc knows, + PTX.
  # Every GPU's, not the first one's (an 8.6 card beside an 8.9 had no kernel image for it), and
  # only numbers: nvidia-smi prints its errors on stdout ("Failed to initialize NVML:
  # Driver/library version mismatch" after a driver update), and they became the architecture.
  ifeq ($(CUDA_ARCH),)
    override CUDA_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | \
                   grep -xE '[0-9]+' | sort -u)
  endif
  ifeq ($(CUDA_ARCH),)
    KNOWN := $(shell $(NVCC) --list-gpu-arch 2>/dev/null | sed 's/compute_//')
    override CUDA_ARCH := $(filter 75 80 86 89 90,$(KNOWN))
  endif
  # Given by hand in any of the usual spellings — 86, 8.6 (nvidia-smi's compute_cap), sm_86,
  # compute_86, "80,90" — as the numbers nvcc's -gencode takes (8.6 reached nvcc as compute_8.6).
  # (override: a value given on make's command line is otherwise left as it is, "" included.)
  override CUDA_ARCH := $(sort $(subst sm_,,$(subst compute_,,$(subst .,,$(subst $(,), ,$(CUDA_ARCH))))))
  BAD_ARCH := $(shell printf '%s\n' $(CUDA_ARCH) | grep -vxE '[0-9]+[af]?')
  ifneq ($(BAD_ARCH),)
    $(error CUDA_ARCH="$(BAD_ARCH)" is no compute capability: give numbers, e.g. CUDA_ARCH=90 or CUDA_ARCH="80 90" (nvidia-smi --query-gpu=compute_cap --format=csv shows your GPU's))
  endif
  # PTX for the newest, in numbers (make's sort put 100 before 90)
  PTX_ARCH := $(lastword $(shell printf '%s\n' $(CUDA_ARCH) | sort -n))
  GENCODE  := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
              -gencode arch=compute_$(PTX_ARCH),code=compute_$(PTX_ARCH)
  CUDA_CFLAGS := -DUSE_CUDA -I$(CUDA_HOME)/include -I$(CUDNN_INC) $(if $(NCCL_INC),-DUSE_NCCL -I$(NCCL_INC))
  NVFLAGS  := -O3 -std=c++17 -Icommon -MMD -MP $(GENCODE) -Xcompiler -Wall,-Wno-unused-parameter -DUSE_CUDA
  LIBDIRS  := $(sort $(CUDA_HOME)/lib64 $(CUDNN_LIB) $(NCCL_LIB) $(NCCL_SO2))
  # -lnccl whenever nccl.h is used (USE_NCCL): keyed on libnccl.so alone, a header without it (pip's
  # nvidia-nccl has libnccl.so.2 only) built comm_nccl.c and linked no NCCL — undefined ncclCommInitRank.
  LDLIBS   += $(foreach d,$(LIBDIRS),-L$(d) -Wl,-rpath,$(d)) -lcudnn -lcublas -lcudart \
              $(if $(NCCL_INC),$(if $(NCCL_SO2),-l:libnccl.so.2,-lnccl)) -lstdc++
  BUILD    := build/cuda
  FOUND    := CUDA $(CUDA_HOME) (sm: $(CUDA_ARCH)), cuDNN $(CUDNN_INC), NCCL $(if $(NCCL_INC),$(NCCL_INC),not found)$(if \
              $(NCCL_INC),$(if $(NCCL_LIB)$(NCCL_SO2),, (no libnccl.so or libnccl.so.2 in NCCL_HOME$(,) CUDA_HOME or the system directories: set NCCL_HOME if the link fails)))
else
  BUILD    := build/cpu
  FOUND    := $(if $(filter 1,$(CPU_ONLY)),CPU_ONLY=1,no CUDA toolkit (CUDA_HOME=$(CUDA_HOME))): building the CPU backend only
endif

COMMON_C  := $(wildcard common/*.c)
COMMON_CU := $(if $(HAVE_CUDA),$(wildcard common/*.cu))
COMMON_O  := $(COMMON_C:%.c=$(BUILD)/%.o) $(COMMON_CU:%.cu=$(BUILD)/%.cu.o)
LIBCOMMON := $(BUILD)/libcommon.a
STAGE_DIRS := $(sort $(wildcard stages/stage[0-9]*_*))
STAGES    := $(foreach d,$(STAGE_DIRS),$(firstword $(subst _, ,$(notdir $(d)))))
TEST_C    := $(filter-out tests/write_synthetic.c,$(wildcard tests/*.c))
TEST_O    := $(TEST_C:%.c=$(BUILD)/%.o)
STAGE_O   := $(foreach d,$(STAGE_DIRS),$(BUILD)/$(d)/main.o)
# What the compiler wrote about which headers each object includes (-MMD -MP).
DEPS      := $(COMMON_O:.o=.d) $(TEST_O:.o=.d) $(STAGE_O:.o=.d) $(BUILD)/tests/write_synthetic.d

# Check (the C unit-test framework) is found through pkg-config, else in the usual directories. It
# is linked statically whenever its archive exists, so the test runner also runs on machines
# without Check (the GPU box); without the archive, pkg-config's (shared) libraries are used.
# Recursive (=), not :=, so that they are looked up when a recipe needs them — after check-dep has
# installed Check on a fresh machine; read when the Makefile is parsed, they would find nothing there
# and the first build would link Check's shared libraries (a runner that fails on the GPU box).
CHECK_PC   = $(shell pkg-config --exists check 2>/dev/null && echo 1)
CHECK_CFLAGS = $(if $(CHECK_PC),$(shell pkg-config --cflags check))
CHECK_A    = $(firstword $(wildcard $(call LIB_OWN,libcheck.a) $(if $(CHECK_PC),$(shell pkg-config --variable=libdir check)/libcheck.a) \
               /usr/lib/x86_64-linux-gnu/libcheck.a /usr/lib/aarch64-linux-gnu/libcheck.a /usr/lib64/libcheck.a \
               /usr/local/lib64/libcheck.a /usr/local/lib/libcheck.a /usr/lib/libcheck.a))
SUBUNIT_A  = $(firstword $(wildcard $(dir $(CHECK_A))libsubunit.a))
CHECK_LIBS = $(if $(CHECK_A),$(CHECK_A) $(SUBUNIT_A) -lrt,$(shell pkg-config --libs check 2>/dev/null))

# OpenSSL's libcrypto (HMAC-SHA256 for the rendezvous store's handshake, common/auth.h): linked
# statically when its archive exists, so the binaries carry it (like Check); else libcrypto.so.3.
# Recursive like Check's, for the same reason (crypto-dep may install it during the build).
CRYPTO_A   = $(firstword $(wildcard $(call LIB_OWN,libcrypto.a) /usr/lib/x86_64-linux-gnu/libcrypto.a /usr/lib/aarch64-linux-gnu/libcrypto.a \
               /usr/lib64/libcrypto.a /usr/local/lib64/libcrypto.a /usr/local/lib/libcrypto.a /usr/lib/libcrypto.a))
CRYPTO_LIBS = $(if $(CRYPTO_A),$(CRYPTO_A) -ldl,-lcrypto)
LDLIBS    += $(CRYPTO_LIBS)

.PHONY: all help test test-parallel check check-dep crypto-dep clang-dep found clean sanitize tsan gpu-sanitize fuzz bench bench2 \
        bench3 bench3-variants bench4 bench5 parity bench-kernels bench-conv-algos timeline compare doc-check $(STAGES)
all: found $(STAGES)

found: crypto-dep
	@echo "build: $(FOUND)"

# libcrypto's headers (libssl-dev): installed through apt-get when missing and we are root. Found in
# the system directories, or wherever the compiler finds them (CFLAGS="-I…", CPATH: an OpenSSL of a
# module or prefix, where a user without root was told to apt-get what the build could already use).
crypto-dep:
	@if [ ! -f /usr/include/openssl/hmac.h ] && [ ! -f /usr/local/include/openssl/hmac.h ] && \
	   ! printf '#include <openssl/hmac.h>\n' | $(CC) $(CFLAGS) -E -x c - >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "OpenSSL's headers are missing: installing libssl-dev with apt-get"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev) >/dev/null || \
	      { echo "error: apt-get install libssl-dev failed"; exit 1; }; \
	  else \
	    echo "error: OpenSSL's libcrypto headers are missing; install them with: sudo apt-get install libssl-dev"; exit 1; \
	  fi; \
	fi

help:
	@echo "make            build every stage ($(STAGES)) at the repository root"
	@echo "make stageN     build one stage, e.g. make stage1 && ./stage1 --help"
	@echo "make test       build and run the Check test suite (CPU; GPU tests run when a GPU is visible)"
	@echo "make check      the same as make test"
	@echo "make test-parallel  the same suites, each its own process, TEST_JOBS (3) at a time: faster, even on 2 cores"
	@echo "make bench      stage 1 vs PyTorch eager on the GPU (needs python3 with torch)"
	@echo "make bench2     stage 2 (DataParallel) vs stage 1 vs PyTorch nn.DataParallel (docs/stage2.md)"
	@echo "make bench3     stage 3 (DDP) vs stage 1 vs PyTorch DDP (docs/stage3.md)"
	@echo "make bench3-variants  where stage 3's two-GPU cost goes: NCCL CTAs/protocol, bucket size, no overlap,"
	@echo "                one process, stage 5, each GPU alone and both at once, against stage 1 (needs 2 GPUs)"
	@echo "make bench4     stage 4 (accumulation, no_sync) vs stages 1 and 3 vs PyTorch DDP no_sync (docs/stage4.md)"
	@echo "make bench5     stage 5 (fp16, bf16, off) vs PyTorch best eager and torch.compile (docs/stage5.md)"
	@echo "make parity     does our trainer learn as PyTorch does? stages 1, 5 and 3 (DDP) and PyTorch on the same"
	@echo "                files, SEEDS (3) seeds each, final test accuracy side by side (GPU + torch; QUICK=1 on the CPU)"
	@echo "make bench-kernels  every kernel of common/kernels.cu and adam.cu against the CPU reference, timed"
	@echo "                against the GPU's peak bandwidth (KERNELS=\"bn_ sgd\" for some; SKIP without CUDA)"
	@echo "make bench-conv-algos  cuDNN's heuristic vs cudnn.benchmark's picks for ResNet-18's convolutions, timed"
	@echo "make timeline TRACE=t.json OUT=t.svg   draw a --trace file as an SVG timeline (docs/trace.md)"
	@echo "make compare    every stage (and its lesson variants) side by side: table + chart in runs/compare/"
	@echo "                (QUICK=1: tiny model, a few steps, the CPU backend without a GPU; COMPARE_OUT=DIR, new or empty)"
	@echo "make doc-check  every relative link of the Markdown resolves; each X.zh-CN.md keeps its English page's"
	@echo "                headings, code and tables; every ./stageN command and \`--flag\` names a real flag;"
	@echo "                a bench command quoted next to its log has the log's step counts;"
	@echo "                the README names every --report record type the code writes; every log in docs/logs is cited"
	@echo "                (tests/doc_check.py; make test runs it, the tutorial's commands and the READMEs' transcripts)"
	@echo "make sanitize   the CPU suite under AddressSanitizer + UBSan with leak checks (build/asan; SUITES=\"a b\" for some)"
	@echo "make tsan       the threaded suites under ThreadSanitizer (build/tsan)"
	@echo "make gpu-sanitize  the CUDA op tests under compute-sanitizer memcheck/racecheck/initcheck/synccheck (GPU)"
	@echo "make fuzz       libFuzzer on the checkpoint loader, CIFAR reader, store and command line (FUZZ_SECONDS=60 each)"
	@echo "make clean      remove build/ and the stage binaries"
	@echo "variables: CUDA_HOME CUDNN_HOME NCCL_HOME CUDA_ARCH=\"80 90\" CPU_ONLY=1 CFLAGS=..."

# Everything in common/ is one static library; the stages and the test runner link it.
$(LIBCOMMON): $(COMMON_O)
	@rm -f $@
	$(AR) rcs $@ $^

# A built binary put in place ($(call put,FROM,TO)): left alone when it is the same, else copied to a
# new file renamed over it, so that a copy in use (./stage3 training while `make` runs) is replaced,
# not written into — cp onto it fails with "Text file busy", and the build with it.
put = cmp -s $(1) $(2) || { cp $(1) $(2).tmp && mv -f $(2).tmp $(2); }

# ./stage1 ← stages/stage1_*/main.c + libcommon.a (any new stages/stageN_*/ gets the same rule)
define STAGE_RULE
$(1): $(BUILD)/$(1)
	@$$(call put,$(BUILD)/$(1),./$(1))
$(BUILD)/$(1): $(BUILD)/$(2)/main.o $(LIBCOMMON)
	$(CC) $$(ALL_CFLAGS) $$(LDFLAGS) -o $$@ $$^ $$(LDLIBS)
endef
$(foreach d,$(STAGE_DIRS),$(eval $(call STAGE_RULE,$(firstword $(subst _, ,$(notdir $(d)))),$(d))))

$(BUILD)/%.o: %.c $(BUILD)/cflags | found
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

# The sources' fingerprint, compiled into cli.o: the ranks of a job compare it with their flags
# (cli_job_flags), so a node running a binary built from other sources (a stale build, another
# commit) is refused, not left computing out of step with the others. Same sources, same number,
# whatever the backend or compiler; cli.o is rebuilt (alone) whenever the number changes — through
# $(BUILD)/source-id (below), so also when a source is deleted or renamed, which leaves no file newer
# than cli.o (it kept the old number, and libcommon.a the deleted file's object).
ID_SOURCES := $(sort $(wildcard common/*.c common/*.h common/*.cu stages/*/*.c))
SOURCE_ID  := $(shell cat $(ID_SOURCES) | cksum | cut -d' ' -f1)
$(BUILD)/common/cli.o: ALL_CFLAGS += -DSOURCE_ID=$(SOURCE_ID)
$(BUILD)/common/cli.o: $(BUILD)/source-id

$(BUILD)/%.cu.o: %.cu $(BUILD)/nvflags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(BUILD)/tests/%.o: tests/%.c $(BUILD)/cflags | check-dep
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -Itests -c -o $@ $<

# The runner is linked in $(BUILD) and put in place as tests/run_tests, like the stages: linked there
# directly, a CUDA runner stayed after `make CPU_ONLY=1 tests/run_tests` (and a CPU one after the
# CUDA build), since the other build's objects were older than it.
TEST_BIN ?= tests/run_tests
$(BUILD)/run_tests: $(TEST_O) $(LIBCOMMON) | check-dep
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)
ifneq ($(TEST_BIN),$(BUILD)/run_tests)
$(TEST_BIN): $(BUILD)/run_tests FORCE
	@$(call put,$<,$@)
endif
FORCE:
.PHONY: FORCE

-include $(DEPS)

# What the objects were built with, each in a file of $(BUILD) rewritten only when it changes: the C
# compiler and its flags (CC, CFLAGS, LDFLAGS, and CUDA_HOME, cuDNN and NCCL through CUDA_CFLAGS),
# nvcc and its flags (CUDA_ARCH), and the sources' fingerprint (cli.o, above). The objects depend on
# them, so a build with other settings rebuilds what those change: before, `make CUDA_ARCH=80` after
# a build for sm_90 linked the sm_90 objects again (no kernel image for an A100), and `make
# CFLAGS="-O0 -g"` kept the -O3 objects.
CONFIG_C   := $(strip $(CC) $(ALL_CFLAGS) $(LDFLAGS))
CONFIG_CU  := $(strip $(NVCC) $(NVFLAGS) $(CUDNN_INC))
define CONFIG_FILE
ifneq ($$($(2)),$$(strip $$(shell cat $(1) 2>/dev/null)))
$(1): FORCE
endif
$(1):
	@mkdir -p $$(@D)
	@printf '%s\n' '$$(subst ','\'',$$($(2)))' > $$@
endef
$(eval $(call CONFIG_FILE,$(BUILD)/cflags,CONFIG_C))
$(eval $(call CONFIG_FILE,$(BUILD)/nvflags,CONFIG_CU))
$(eval $(call CONFIG_FILE,$(BUILD)/source-id,SOURCE_ID))

# Check (the C unit-test framework): installed through apt-get when missing and we are root.
check-dep:
	@if ! { pkg-config --exists check 2>/dev/null || [ -f /usr/include/check.h ]; } || \
	   [ -z "$(CHECK_A)$(CHECK_PC)" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "Check is missing: installing it with apt-get"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq check) >/dev/null || \
	      { echo "error: apt-get install check failed"; exit 1; }; \
	  else \
	    echo "error: the Check unit-test library is missing; install it with: sudo apt-get install check"; exit 1; \
	  fi; \
	fi

# The kernel harnesses (below): defined here, before `test` names them as prerequisites.
BENCH_KERNELS := $(BUILD)/tests/bench_kernels
BENCH_CONV_ALGOS := $(BUILD)/tests/bench_conv_algos

# The suite runs the stage binaries end to end, so they are built first. Check's own summary line
# ("100%: Checks: N, Failures: 0, Errors: 0") is the last thing printed.
test: check-dep $(STAGES) tests/write_synthetic $(if $(HAVE_CUDA),$(BENCH_KERNELS) $(BENCH_CONV_ALGOS))
	@$(MAKE) --no-print-directory tests/run_tests
	./tests/run_tests

check: test

# The same suites, each in its own process, TEST_JOBS at a time, the longest first
# (tests/run_suites.sh): for a GPU host with cores to spare, where `make test` waits on one suite
# after another. One summary line per suite, then the total.
TEST_JOBS ?= 3
test-parallel: check-dep $(STAGES) tests/write_synthetic $(if $(HAVE_CUDA),$(BENCH_KERNELS) $(BENCH_CONV_ALGOS))
	@$(MAKE) --no-print-directory tests/run_tests
	JOBS=$(TEST_JOBS) bash tests/run_suites.sh

bench: stage1
	bash tests/bench_stage1.sh

bench2: stage1 stage2
	bash tests/bench_stage2.sh

bench3: stage1 stage3
	bash tests/bench_stage3.sh

bench3-variants: stage1 stage3 stage5
	bash tests/bench_stage3_variants.sh

doc-check: $(STAGES)
	python3 tests/doc_check.py --stages .

bench4: stage1 stage3 stage4
	bash tests/bench_stage4.sh

bench5: stage5
	bash tests/bench_stage5.sh

# The synthetic set written as CIFAR-10 files (tests/write_synthetic.c), for other trainers: `make
# parity` (tests/train_parity.sh) trains PyTorch on those bytes beside ./stage1, ./stage5 and ./stage3 --data,
# several seeds each — does our trainer learn as PyTorch does? Needs a GPU and torch (QUICK=1: the
# CPU smoke run, tiny model, which make test runs). Built without Check: the GPU host has none.
tests/write_synthetic: $(BUILD)/write_synthetic
	@$(call put,$<,$@)
$(BUILD)/write_synthetic: $(BUILD)/tests/write_synthetic.o $(LIBCOMMON)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/tests/write_synthetic.o: tests/write_synthetic.c $(BUILD)/cflags | found
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<
parity: stage1 stage3 stage5 tests/write_synthetic
	bash tests/train_parity.sh

# The kernel harnesses, tests/bench_*.cu: host code that nvcc compiles (C++, the CUDA runtime) and the
# C compiler links like a stage. Built by `make test` too (not run), so a change that breaks one is
# caught at once.
#  - make bench-kernels: our own kernels, each against the CPU reference and timed against the GPU's
#    peak memory bandwidth (tests/bench_kernels.cu; KERNELS="bn_ sgd" runs the rows whose name
#    contains one of the words);
#  - make bench-conv-algos: cuDNN's heuristic against its measured choice (cudnn.benchmark) for every
#    convolution of ResNet-18, each pick timed as a training step runs it (tests/bench_conv_algos.cu;
#    CONV_ARGS="fp16" for stage 5's types, "fp32 nchw" for the old layout).
ifeq ($(HAVE_CUDA),1)
.PRECIOUS: $(BUILD)/tests/%.cu.o
$(BUILD)/tests/%.cu.o: tests/%.cu $(BUILD)/nvflags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -I$(CUDNN_INC) -c -o $@ $<
$(BUILD)/tests/bench_%: $(BUILD)/tests/bench_%.cu.o $(LIBCOMMON)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)
-include $(BUILD)/tests/bench_kernels.cu.d $(BUILD)/tests/bench_conv_algos.cu.d
bench-kernels: $(BENCH_KERNELS)
	./$(BENCH_KERNELS) $(KERNELS)
bench-conv-algos: $(BENCH_CONV_ALGOS)
	./$(BENCH_CONV_ALGOS) $(CONV_ARGS)
else
bench-kernels bench-conv-algos:
	@echo "SKIP: make $@ needs the CUDA build ($(FOUND))"
endif

# A --trace file drawn as an SVG timeline (tests/timeline.py: Python 3, standard library only).
# TRACE, OUT and TITLE reach the shell through the environment (make exports command-line variables),
# never pasted into the command line: a path with spaces, quotes or $ stays one argument.
timeline:
	@test -n "$$TRACE" || { echo "usage: make timeline TRACE=trace.json [OUT=trace.svg] [TITLE='...']"; exit 2; }
	case "$${TRACE##*/}" in *.*) svg="$${TRACE%.*}.svg" ;; *) svg="$$TRACE.svg" ;; esac; \
	python3 tests/timeline.py "$$TRACE" "$${OUT:-$$svg}" $${TITLE:+--title "$$TITLE"}

# Every stage that exists, one setting, one table (tests/compare.sh; QUICK=1 is the CI-sized variant).
# QUICK, COMPARE_OUT, STEPS, GPUS, … reach the script through the environment (make exports
# command-line variables), never pasted into the command line: COMPARE_OUT="my out" stays one path.
compare: $(STAGES)
	bash tests/compare.sh

# ---- sanitizers and fuzzers (CPU backend; each in its own build directory) ----------------------
# A sub-make builds the stages and the test runner there with the sanitizer in CFLAGS (which
# ALL_CFLAGS appends to the build's own flags); the suite then runs them from build/X/root, which
# holds those stage binaries and links to tests/, stages/ and docs/ (TEST_ROOT). `make sanitize` runs
# SAN_SUITES (a CPU-only build: GPU tests print SKIP); SUITES="a b" runs those instead.
# Every suite, read from the runner's list in tests/test_main.c, so a new suite is sanitized too.
# (compare and tutorial, which run every stage end to end, were left out while the GEMM was
# instrumented: they outlasted their time limits; now they take ~40 and ~200 s.)
# tests/write_synthetic (data and compare run it) comes through the tests/ link: the plain CPU build
# of it when none is there — a helper the suites call, its writer sanitized in the data suite.
SAN_SUITES  ?= $(shell sed -n 's/^ *suite_\([a-z0-9_]*\),$$/\1/p' tests/test_main.c)
TSAN_SUITES ?= ops_ref loader gil dp dist ddp store syncbn
SUITES      ?=
# -O2, not the customary -O1: the CPU reference ops dominate these suites, and -O2 ran the e2e suite
# in 445 s against 673 s under ASan (2 cores, 2026-12-01); the frame pointer keeps the reports' stacks.
# The GEMM's inner loop is built uninstrumented, its reads checked once per call (REF_UNCHECKED in
# common/ops_ref_impl.h): a sanitized training step ran 6× faster, and CI has 90 minutes in all.
ASAN_FLAGS  := -O2 -g -fno-omit-frame-pointer -fno-sanitize-recover=undefined -fsanitize=address,undefined
TSAN_FLAGS  := -O1 -g -fno-omit-frame-pointer -fsanitize=thread

define SAN_RUN
	@$(MAKE) --no-print-directory CPU_ONLY=1 BUILD=build/$(1) CFLAGS="$(2)" LDFLAGS="$(3)" \
	  TEST_BIN=build/$(1)/run_tests build/$(1)/run_tests $(STAGES:%=build/$(1)/%)
	@[ -x tests/write_synthetic ] || $(MAKE) --no-print-directory CPU_ONLY=1 tests/write_synthetic
	@rm -rf build/$(1)/root && mkdir -p build/$(1)/root && cp $(STAGES:%=build/$(1)/%) build/$(1)/root/ && \
	  for d in tests stages docs; do ln -s ../../../$$d build/$(1)/root/$$d; done
	@fail=0; for s in $(if $(SUITES),$(SUITES),$(4)); do \
	  echo "== $(1): $$s"; t0=$$SECONDS; TEST_ROOT=build/$(1)/root $(5) build/$(1)/run_tests $$([ $$s = all ] || echo $$s) 2>&1 | \
	    grep -vE '^warning: rendezvous store|^$$' | tail -n 60; \
	  [ $${PIPESTATUS[0]} = 0 ] || fail=1; echo "== $(1): $$s took $$((SECONDS - t0)) s"; \
	done; exit $$fail
endef

sanitize: SHELL := /bin/bash
sanitize: check-dep
	$(call SAN_RUN,asan,$(ASAN_FLAGS),-fsanitize=address$(,)undefined,$(SAN_SUITES),\
	  TEST_TIME_SCALE=3 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)

gpu-sanitize: tests/run_tests
	bash tests/gpu_sanitize.sh

tsan: SHELL := /bin/bash
tsan: check-dep
	$(call SAN_RUN,tsan,$(TSAN_FLAGS),-fsanitize=thread,$(TSAN_SUITES),TEST_TIME_SCALE=3 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1)

# libFuzzer (clang): installed through apt-get when missing and we are root, like Check.
FUZZ_SECONDS ?= 60
FUZZERS     := checkpoint cifar store cli
FUZZ_FLAGS  := -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=undefined -fsanitize=address,undefined
clang-dep:
	@if ! command -v clang >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "clang is missing: installing it with apt-get (for libFuzzer)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang) >/dev/null || \
	      { echo "error: apt-get install clang failed"; exit 1; }; \
	  else \
	    echo "error: make fuzz needs clang (libFuzzer); install it with: sudo apt-get install clang"; exit 1; \
	  fi; \
	fi

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h fuzz-lib
	clang $(FUZZ_FLAGS),fuzzer -std=c11 -D_GNU_SOURCE -Icommon -o $@ $< build/fuzz/libcommon.a -lm -lpthread $(CRYPTO_LIBS)

fuzz-lib: clang-dep
	@$(MAKE) --no-print-directory CPU_ONLY=1 CC=clang BUILD=build/fuzz CFLAGS="$(FUZZ_FLAGS),fuzzer-no-link" \
	  build/fuzz/libcommon.a

# Each fuzzer runs FUZZ_SECONDS on a copy of its seed corpus (tests/fuzz/NAME/); a finding is saved
# as build/fuzz/crash-* and fails the target.
fuzz: SHELL := /bin/bash
fuzz: clang-dep $(FUZZERS:%=build/fuzz/fuzz_%)
	@for f in $(FUZZERS); do \
	  mkdir -p build/fuzz/corpus/$$f && cp tests/fuzz/$$f/* build/fuzz/corpus/$$f/ && \
	  echo "== fuzz $$f for $(FUZZ_SECONDS) s" && \
	  ASAN_OPTIONS=detect_leaks=0 build/fuzz/fuzz_$$f -max_total_time=$(FUZZ_SECONDS) -max_len=16384 \
	    -artifact_prefix=build/fuzz/ -print_final_stats=1 build/fuzz/corpus/$$f 2>&1 | \
	    grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY|artifact)" ; \
	  [ $${PIPESTATUS[0]} = 0 ] || exit 1; \
	done

.PHONY: fuzz-lib

clean:
	rm -rf build tests/run_tests $(STAGES) tests/run_tests.tmp $(STAGES:%=%.tmp)
