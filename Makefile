# The two commands a newcomer needs: `make serve` and `make test`.
# Both install their Debian packages first and are safe to run again.
BUILD ?= build
ASAN_BUILD ?= build-asan
# Clang builds: the libFuzzer targets, and the suite under clang's sanitizers.
FUZZ_BUILD ?= build-fuzz
ASAN_CLANG_BUILD ?= build-asan-clang
# Seconds per fuzz target: `make fuzz` (long runs) and the smoke run of `make test`.
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 30
# Empty = every target in tests/fuzz/run.sh.
FUZZ_TARGETS ?=
JOBS ?= $(shell nproc)
MODEL ?= deploy/models/stories260K/stories260K.bin
TOKENIZER ?= deploy/models/stories260K/tok512.bin
THREADS ?= 2
# Compute threads per worker rank under `make serve` (two ranks share the cores).
WORKER_THREADS ?= 1
# One-shot prompt for `make serve PROMPT="..."`; empty = interactive.
PROMPT ?=
# Ranks of the served group: 2 (TP2), or 1 (one worker holding the model).
WORLD ?= 2
# Speculative decoding under `make serve` (the router's --spec_drafters).
SPEC_DRAFTERS ?= ngram,suffix

.PHONY: all deps configure build test serve generate asan asan-clang fuzz-build fuzz-targets bench-peer \
	fuzz fuzz-smoke bench bench-context bench-hybrid bench-kda kvstore-bench soak monitor image-cpu image-cuda format clean

all: build

deps:
	@tools/install_deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

# Builds and runs every test, then each fuzz target for FUZZ_SMOKE_SECONDS.
test: build fuzz-targets
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
	@tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SMOKE_SECONDS) $(FUZZ_TARGETS)

# Serves the bundled model: two worker daemons as one TP2 group and the
# router in front of them on loopback, the gRPC API on 127.0.0.1:50051; the
# gRPC client runs in the foreground (type a prompt, get streamed text).
serve: build
	@BUILD=$(BUILD) MODEL=$(MODEL) TOKENIZER=$(TOKENIZER) THREADS=$(WORKER_THREADS) \
	  SPEC_DRAFTERS=$(SPEC_DRAFTERS) WORLD=$(WORLD) \
	  deploy/local/serve.sh "$(PROMPT)"

# Debian's Prometheus with deploy/prometheus/ (scrape config and alert rules)
# against the cluster `make serve` runs (its LISTENING lines in $(BUILD)/serve/),
# on http://127.0.0.1:9090 (PROM_LISTEN=); start it in a second terminal.
monitor: deps
	@BUILD=$(BUILD) deploy/prometheus/monitor.sh

# The container images (deploy/images; root, debootstrap from the Debian
# registry, podman where installed): the CPU image from $(BUILD)-cpu, a build
# without CUDA, and the CUDA image from $(BUILD). Checked by ctest
# image_cpu_test / image_cuda_test.
image-cpu: deps
	@cmake -S . -B $(BUILD)-cpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRINGLANE_WITH_CUDA=OFF >/dev/null
	@cmake --build $(BUILD)-cpu -j$(JOBS) --target ringlane-worker ringlane-router ringlane-kvstore
	@deploy/images/build.sh cpu $(BUILD)-cpu
image-cuda: build
	@deploy/images/build.sh cuda $(BUILD)

# The generator over the engine in one process (no daemons).
generate: build
	@$(BUILD)/tools/ringlane-generate --model=$(MODEL) --tokenizer=$(TOKENIZER) \
	  --threads=$(THREADS) $(if $(PROMPT),--prompt="$(PROMPT)")

# Under the sanitizers: a small quarantine, so the attack test's RSS bounds
# measure the daemons and not ASan's hold on freed memory (256 MB by
# default); third-party leaks at exit in tests/lsan.supp.
SANITIZER_ENV = ASAN_OPTIONS=quarantine_size_mb=16 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer.
asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DRINGLANE_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS)
	@cd $(ASAN_BUILD) && $(SANITIZER_ENV) ctest --output-on-failure -j$(JOBS)

# The suite built by clang under ASan and UBSan with float-cast-overflow
# (GCC's UBSan lacks it), every finding fatal. -O1: the e2e tests have
# deadlines that -O0 under ASan would miss.
asan-clang: deps
	@CC=clang CXX=clang++ cmake -S . -B $(ASAN_CLANG_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" "-DCMAKE_C_FLAGS_DEBUG=-O1 -g" \
	  -DRINGLANE_SANITIZE=ON -DRINGLANE_WITH_CUDA=OFF >/dev/null
	@cmake --build $(ASAN_CLANG_BUILD) -j$(JOBS)
	@cd $(ASAN_CLANG_BUILD) && $(SANITIZER_ENV) ctest --output-on-failure -j$(JOBS)

# The libFuzzer targets of tests/fuzz (clang), and only the libraries they
# link; fuzz-targets is the same without installing packages first.
fuzz-build: deps fuzz-targets
fuzz-targets:
	@command -v clang++ >/dev/null || { echo "fuzzing needs clang++ (tools/install_deps.sh)"; exit 1; }
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DRINGLANE_FUZZ=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" \
	  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g" -DRINGLANE_WITH_CUDA=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j$(JOBS) --target fuzz_targets

# Long fuzzing runs; the working corpus stays in $(FUZZ_BUILD)/fuzz-corpus,
# crash inputs land in tests/fuzz/crashes/ (see tests/fuzz/run.sh).
fuzz: fuzz-build
	@tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-smoke: fuzz-build
	@tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SMOKE_SECONDS) $(FUZZ_TARGETS)

# Engine benchmarks on a synthetic 1.1B FP8 model (written once, ~1.2 GB).
bench: build
	@test -f $(BUILD)/models/synth-1b1-fp8/config.json || \
	  $(BUILD)/tools/ringlane-synth-model --preset=1b1 --out=$(BUILD)/models/synth-1b1-fp8
	@$(BUILD)/tools/ringlane-engine-bench --model=$(BUILD)/models/synth-1b1-fp8

# Issue 16's decode at long context, dense against DSA, and KV bytes per token,
# on GLM-5's attention widths (written once to build/models/glm5-small).
bench-context: build
	@test -f $(BUILD)/models/glm5-small/config.json || \
	  $(BUILD)/tools/ringlane-synth-model --preset=glm5-small --out=$(BUILD)/models/glm5-small
	@test -f $(BUILD)/models/glm5-next-small/config.json || \
	  $(BUILD)/tools/ringlane-synth-model --preset=glm5-next-small \
	  --out=$(BUILD)/models/glm5-next-small
	@$(BUILD)/tools/ringlane-context-bench --model=$(BUILD)/models/glm5-small \
	  --contexts=4096,16384,65536 --steps=3
	@$(BUILD)/tools/ringlane-context-bench --model=$(BUILD)/models/glm5-next-small \
	  --contexts=4096,16384,65536 --steps=3

# Issue 20's side by side with llama.cpp b10573 (../shared/peers/llamacpp):
# engine decode, batch of 5 and prefill, medians of PEER_REPEATS (3)
# interleaved runs. Building the peer needs GIT_DIR_LLAMACPP once.
bench-peer: build
	@BUILD=$(BUILD) tools/peer_bench.sh $(or $(PEER_REPEATS),3)

# Issue 14's time to first token: cold, device pool, kvstore DRAM, kvstore disk.
kvstore-bench: build
	@tools/kvstore_bench.sh $(BUILD) 2400 3

# Issue 19: time to first token of a long prompt on the glm5_next hybrid,
# cold and resent (resumed from its state checkpoint).
bench-hybrid: build
	@tools/hybrid_resend_bench.sh $(BUILD) 1200 3

# Prefill with the KDA layers recurrent and chunked (--kda_chunk), side by side.
bench-kda: build
	@tools/kda_chunk_bench.sh $(BUILD) 2048 3 64

# Issue 13's soak: 5 streams for SOAK_SECONDS (600) against a local TP2
# cluster; RSS and open descriptors of every daemon must stay flat.
soak: build
	@BUILD=$(BUILD) SOAK_SECONDS=$(or $(SOAK_SECONDS),600) tools/soak.sh

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD) $(ASAN_CLANG_BUILD) $(FUZZ_BUILD)
