# sluice: the two commands are `make run` and `make test`; everything else is a helper.
# Every target installs the Debian packages the build needs first (as root), or prints the
# exact apt-get line and stops (as anyone else).

DEB_PACKAGES := cmake make g++ pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev \
                libcli11-dev libxxhash-dev libgtest-dev liburing-dev
BUILD_DIR    ?= build
JOBS         ?= $(shell nproc)
DEFAULT_MODEL ?= models/demo
DEFAULT_PROMPT ?= The old man walked slowly
RUN_TOKENS   ?= 64
RUN_FLAGS    ?= --temperature 0.7 --top-p 0.9 --seed 3

.PHONY: all deps build run test clean

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	  else \
	    echo "sluice needs these Debian packages; run as root:"; \
	    echo "  apt-get install -y$$missing"; \
	    exit 1; \
	  fi; \
	fi

build: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	@printf '%s' "$(DEFAULT_PROMPT)"
	@$(BUILD_DIR)/bin/sluice run --model $(DEFAULT_MODEL) --prompt "$(DEFAULT_PROMPT)" -n $(RUN_TOKENS) $(RUN_FLAGS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE gpu

clean:
	rm -rf $(BUILD_DIR)
