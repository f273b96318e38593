# Thin wrapper around CMake. The two commands of the README:
#   make run    install missing dependencies (apt-get, when root or sudo), build, run the
#               conformance suite and the demo on every device found
#   make test   build and run the whole test suite with ctest
# and make test-asan, make fuzz, make test-arm (below).
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps build run test test-asan clean install

all: build

deps:
	@bash scripts/deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/bin/pagekv check --device all
	$(BUILD)/bin/pagekv demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The unit, KV and server tests under AddressSanitizer and UndefinedBehaviorSanitizer
# (without the Vulkan validation layer, which make test already runs: it would
# only slow the sanitized Vulkan KV test down), and without the MPI tests (label
# dist): LeakSanitizer reports Open MPI's own allocations at each rank's exit
# (about 120 KB in 3,400 objects, in libmpi and its plugins), which fail the ranks.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPKV_SANITIZE=address,undefined -DPKV_TEST_VALIDATE=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L 'unit|kv|server' -LE dist

# The header, both libraries, the CLI, pkg-config and CMake files, and the Python
# package next to the library (docs/python.md). PREFIX defaults to CMake's (/usr/local).
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(ARM_BUILD)

# Vulkan as real GPUs see it (docs/gpu.md): pagekv check on vulkan:0 under every
# limits profile, then the essential Vulkan tests again under the strictest one,
# and the randomized KV test (2,000 operations a seed instead of 10,000) and the
# tensor-parallel model test under each of the five others (about 12 s a profile
# on two quiet cores), all still under the validation layer. Skipped where there
# is no vulkan:0. The whole Vulkan suite under every profile is too slow for CI
# (test-engine-vulkan alone takes minutes); docs/gpu.md records a run by hand.
VK_PROFILES = mali adreno intel-xe nvidia rdna strict
VK_STRICT = ^(test-vulkan|test-model-vulkan|test-kv-random-vulkan|test-multi-vulkan)$$
VK_EACH = ^(test-kv-random-vulkan|test-multi-vulkan)$$
.PHONY: test-vulkan-profiles
test-vulkan-profiles: build
	@if ! $(BUILD)/bin/pagekv devices | grep -q '^vulkan:0'; then echo "test-vulkan-profiles: no vulkan:0, skipped"; exit 0; fi; \
	for p in $(VK_PROFILES); do \
		PKV_VK_LIMITS=$$p $(BUILD)/bin/pagekv check --device vulkan:0 > $(BUILD)/check-$$p.txt 2>&1 \
			|| { cat $(BUILD)/check-$$p.txt; echo "pagekv check failed under PKV_VK_LIMITS=$$p"; exit 1; }; \
		echo "PKV_VK_LIMITS=$$p pagekv check --device vulkan:0: $$(tail -1 $(BUILD)/check-$$p.txt)"; \
	done; \
	cd $(BUILD) && PKV_VK_LIMITS=strict ctest --output-on-failure -j $(JOBS) -R '$(VK_STRICT)' || exit 1; \
	for p in $(filter-out strict,$(VK_PROFILES)); do \
		echo "PKV_VK_LIMITS=$$p:"; \
		PKV_VK_LIMITS=$$p PKV_KV_RANDOM_OPS=2000 ctest --output-on-failure -j $(JOBS) -R '$(VK_EACH)' || exit 1; \
	done

# The 64-bit ARM build (docs/testing.md): cross-compiled with Debian's
# gcc-aarch64-linux-gnu into build-arm/ (cmake/aarch64-linux-gnu.cmake; no Vulkan,
# CUDA or server) and tested under qemu-user, whose "max" CPU has dotprod and i8mm,
# so every ARM path of the CPU kernels runs. qemu runs the tests 50-150x slower
# than natively, so to stay within 10 minutes on 2 cores, build included:
#  - on the best path (PKV_CPU_PATH=i8mm) the unit, kernel, KV and model tests
#    (ctest -L 'unit|kernels|kv|model'; those needing Vulkan, CUDA or the server
#    skip) except ARM_SKIP: the randomized KV cache test, sliding windows,
#    speculative decoding and the CLI end to end, architecture-neutral code that
#    takes minutes each under qemu (make test runs them natively);
#  - test-cpu-kernels and test-cpu-attention (in that set) force every path
#    themselves: generic, neon, dotprod and i8mm, each against the reference,
#    batch- and thread-invariant bitwise, and the three ARM paths bitwise equal;
#  - on generic, neon and dotprod again ARM_INVARIANCE: fork == replay and a
#    batch equal to separate runs (test-model; Gemma 4 and the recurrent hybrid),
#    the engine under threads, quantized KV pages and state save/load.
ARM_BUILD ?= build-arm
ARM_SKIP = ^(test-kv-random|test-kv-window|test-engine-spec|test-cli|test-cli-vocab|test-run-chat)$$
ARM_INVARIANCE = ^(test-model|test-model-gemma4|test-model-hybrid|test-engine-threads|test-kv-quant|test-kv-state)$$
.PHONY: test-arm
test-arm:
	@bash scripts/deps.sh arm
	cmake -S . -B $(ARM_BUILD) -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
		-DCMAKE_BUILD_TYPE=Release -DPKV_VULKAN=OFF -DPKV_CUDA=OFF
	cmake --build $(ARM_BUILD) -j $(JOBS)
	@echo "== test-arm: path i8mm (the unit, kernel, KV and model tests)"
	cd $(ARM_BUILD) && QEMU_CPU=max PKV_CPU_PATH=i8mm ctest --output-on-failure -j $(JOBS) \
		-L 'unit|kernels|kv|model' -E '$(ARM_SKIP)'
	@for p in generic neon dotprod; do \
		echo "== test-arm: path $$p (the invariance tests)"; \
		(cd $(ARM_BUILD) && QEMU_CPU=max PKV_CPU_PATH=$$p ctest --output-on-failure -j $(JOBS) -R '$(ARM_INVARIANCE)') || exit 1; \
	done

# libFuzzer harnesses (fuzz/, docs/testing.md): built with clang into build-fuzz/,
# seeds written by the project itself, each harness run FUZZ_SECONDS seconds.
# Crashes land in build-fuzz/crashes/ with a one-line reproduce command.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
.PHONY: fuzz fuzz-build fuzz-corpus
fuzz-build:
	@bash scripts/deps.sh fuzz
	cmake -S fuzz -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=$(FUZZ_CC)
	cmake --build $(FUZZ_BUILD) -j $(JOBS)

fuzz-corpus: fuzz-build
	rm -rf $(FUZZ_BUILD)/seeds
	$(FUZZ_BUILD)/bin/pkv-fuzz-seeds $(FUZZ_BUILD)/seeds
	# the template interpreter's harness starts from the real model templates of the golden tests
	mkdir -p $(FUZZ_BUILD)/seeds/jinja
	cp tests/templates/*.jinja $(FUZZ_BUILD)/seeds/jinja/

fuzz: fuzz-corpus
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash fuzz/run.sh $(FUZZ_BUILD)
