# Thin wrapper around CMake. The two commands of the README:
#   make run    install missing dependencies (apt-get, when root or sudo), build, run the
#               conformance suite and the demo on every device found
#   make test   build and run the whole test suite with ctest
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps build run test test-asan clean

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

# The unit, KV and server tests under AddressSanitizer and UndefinedBehaviorSanitizer.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPKV_SANITIZE=address,undefined $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L 'unit|kv|server'

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

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
