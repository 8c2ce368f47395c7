# ferry — the README's two commands: `make demo` and `make test`.
#   make            build (build/)
#   make test       unit + integration tests, an ASan+UBSan build of them, the threaded tests under
#                   TSan, and the fuzz corpus replay
#   make demo       build and run `ferry demo` on a model it generates
#   make fuzz       libFuzzer targets (clang), each for FUZZ_SECONDS (default 60)
#   make install PREFIX=/usr/local
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 60
WERROR ?= OFF

.PHONY: all build test test-fast test-asan test-tsan demo fuzz install clean

# the CMake-generated makefiles run make recursively: no "Entering directory" line for each
MAKEFLAGS += --no-print-directory
CONFIGURE = cmake -S . -B $(BUILD) -DFERRY_WERROR=$(WERROR) -DCMAKE_INSTALL_PREFIX=$(PREFIX) \
	$(CMAKE_FLAGS) >/dev/null

all: build

build:
	@$(CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS)

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan:
	@cmake -S . -B $(BUILD)-asan -DFERRY_WERROR=$(WERROR) -DFERRY_SANITIZE=address,undefined \
		-DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-O1 $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

test-tsan:
	@cmake -S . -B $(BUILD)-tsan -DFERRY_WERROR=$(WERROR) -DFERRY_SANITIZE=thread \
		-DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-O1 $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD)-tsan -j $(JOBS)
	cd $(BUILD)-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
		ctest --output-on-failure -j $(JOBS) -L threads

test: test-fast test-asan test-tsan
	@echo "make test: all suites passed"

# only the tool: the demo starts after a few lines, not the whole build's
demo:
	@$(CONFIGURE)
	@cmake --build $(BUILD) -j $(JOBS) --target ferry_cli
	@./$(BUILD)/ferry demo

fuzz:
	@cmake -S . -B $(BUILD)-fuzz -DCMAKE_C_COMPILER=clang -DFERRY_FUZZ=ON \
		-DFERRY_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug \
		"-DCMAKE_C_FLAGS=-O1 -fsanitize=fuzzer-no-link" >/dev/null
	@cmake --build $(BUILD)-fuzz -j $(JOBS)
	@for t in gguf safetensors index; do \
		mkdir -p $(BUILD)-fuzz/corpus-$$t; \
		echo "fuzzing $$t for $(FUZZ_SECONDS)s"; \
		./$(BUILD)-fuzz/tests/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
			-artifact_prefix=$(BUILD)-fuzz/ $(BUILD)-fuzz/corpus-$$t tests/fuzz/corpus/$$t || exit 1; \
	done

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-fuzz
