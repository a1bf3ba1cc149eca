# The two commands a newcomer needs: `make serve` and `make test`.
# Both install their Debian packages first and are safe to run again.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
MODEL ?= deploy/models/stories260K/stories260K.bin
TOKENIZER ?= deploy/models/stories260K/tok512.bin
THREADS ?= 2
# Compute threads per worker rank under `make serve` (two ranks share the cores).
WORKER_THREADS ?= 1
# One-shot prompt for `make serve PROMPT="..."`; empty = interactive.
PROMPT ?=

.PHONY: all deps configure build test serve generate asan bench soak format clean

all: build

deps:
	@tools/install_deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

# Builds and runs every test.
test: build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# Serves the bundled model: two worker daemons as one TP2 group and the
# router in front of them on loopback, the gRPC API on 127.0.0.1:50051; the
# gRPC client runs in the foreground (type a prompt, get streamed text).
serve: build
	@BUILD=$(BUILD) MODEL=$(MODEL) TOKENIZER=$(TOKENIZER) THREADS=$(WORKER_THREADS) \
	  deploy/local/serve.sh "$(PROMPT)"

# The generator over the engine in one process (no daemons).
generate: build
	@$(BUILD)/tools/ringlane-generate --model=$(MODEL) --tokenizer=$(TOKENIZER) \
	  --threads=$(THREADS) $(if $(PROMPT),--prompt="$(PROMPT)")

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer.
asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DRINGLANE_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS)
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j$(JOBS)

# Engine benchmarks on a synthetic 1.1B FP8 model (written once, ~1.2 GB).
bench: build
	@test -f $(BUILD)/models/synth-1b1-fp8/config.json || \
	  $(BUILD)/tools/ringlane-synth-model --preset=1b1 --out=$(BUILD)/models/synth-1b1-fp8
	@$(BUILD)/tools/ringlane-engine-bench --model=$(BUILD)/models/synth-1b1-fp8

# Issue 13's soak: 5 streams for SOAK_SECONDS (600) against a local TP2
# cluster; RSS and open descriptors of every daemon must stay flat.
soak: build
	@BUILD=$(BUILD) SOAK_SECONDS=$(or $(SOAK_SECONDS),600) tools/soak.sh

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD)
