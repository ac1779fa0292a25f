# moonjob -- build, test, bench and install.
#
# LuaRocks drives this file (build.type = "make"): it passes CFLAGS, LIBFLAG,
# LUA_INCDIR and BUILD=build-luarocks (its own build directory) both times,
# and PREFIX, BINDIR, LIBDIR, LUADIR at install time (see the rockspec).
# Everything is overridable; DESTDIR is honoured by install.
LUA        ?= luajit
LUA_INCDIR ?= /usr/include/luajit-2.1
CC         ?= cc
CFLAGS     ?= -O2 -g
LIBFLAG    ?= -shared
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib/lua/5.1
LUADIR     ?= $(PREFIX)/share/lua/5.1
DESTDIR    ?=
BUSTED     ?= busted
LDFLAGS    ?=

WARN       = -Wall -Wextra -Wno-unused-parameter -std=gnu11
MJ_CFLAGS  = $(CFLAGS) $(WARN) -fPIC -I$(LUA_INCDIR)
UV_LIBS    = -luv -lhiredis -lhttp_parser -lssl -lcrypto
LUAJIT_LIB = -lluajit-5.1

BUILD      = build
CORE_SO    = $(BUILD)/moonjob/core.so
CHILD      = $(BUILD)/moonjob/moonjob-child

# The C sources: core/parent/ makes core.so, core/child/ the child program,
# and core/json_scan.c (the JSON codec's C half) goes into both: linked into
# core.so as an object, #included by the child's main.c. Its moonjob_*
# functions are the codec's through the FFI on both sides (ffi.load of
# core.so in the parent, which runs no luaopen; ffi.C in the child).
# The core's files are compiled and linked as objects, in $(BUILD)/obj/.
# Its Lua bindings and the child program are each one translation unit, whose
# root file #includes its parts as luv includes its binding files, so that
# their internal functions stay static: the bindings (core/parent/bind/
# module.c) reach Lua only through module.c's registration tables, and the
# child (core/child/main.c) is linked -rdynamic, so that the runner's FFI
# finds its moonjob_* functions, where any other non-static symbol would join
# the dynamic symbol table a processor's code sees. Header dependencies,
# included parts too, are the compiler's own (-MMD -MP: a .d beside each .o).
CORE_SRC   = $(addprefix core/parent/,loop.c process.c channel.c send.c shared.c spawn.c reap.c \
               stdio.c output.c redis.c redis_tls.c http.c http_response.c bind/module.c) core/json_scan.c
CORE_OBJ   = $(CORE_SRC:core/%.c=$(BUILD)/obj/%.o)
CHILD_OBJ  = $(BUILD)/obj/child/main.o
C_DEPS     = $(CORE_OBJ:.o=.d) $(CHILD_OBJ:.o=.d)
$(CORE_OBJ): INCLUDES = -Icore -Icore/parent
$(CHILD_OBJ): INCLUDES = -Icore
# The modules, and the dashboard's page (static/: HTML, JS, CSS), installed beside them.
LUA_FILES  = $(shell find lua/moonjob -name '*.lua') $(wildcard lua/moonjob/dashboard/static/*)
FLAGS_STAMP = $(BUILD)/flags

DEB_PACKAGES = build-essential pkg-config luajit libluajit-5.1-dev libuv1-dev lua-cjson \
               lua-busted luarocks procps libhiredis-dev redis-server redis-tools python3-redis \
               iproute2 git
DEB_PACKAGES += lua-luv rlwrap   # luv: the spec of a host event loop; rlwrap: make repl's line editing
DEB_PACKAGES += libhttp-parser-dev curl # the core's HTTP server (http.c); curl: its spec's client
DEB_PACKAGES += libssl-dev ca-certificates # Redis over TLS (redis_tls.c: OpenSSL); the system's trust store
DEB_PACKAGES += prometheus      # promtool: the metrics specs check pool:metrics()'s text with it
DEB_PACKAGES += chromium        # the dashboard's browser spec (spec/browser/; Node: browser-deps)
DEB_PACKAGES += faketime        # the schedules spec runs a worker whose clock is far off
DEB_PACKAGES += tzdata          # time zones of schedules: the tz database the producer reads
DEB_PACKAGES += lua5.2 lua5.3 lua5.4 lua-socket lua-redis # the pure-Lua producer's spec and bench: plain Luas, redis-lua

.PHONY: all deps bench-deps bullmq-deps browser-deps openresty-deps valkey-deps spec-host test test-fast test-valkey sanitize chaos demo repl bench install uninstall clean

IN_TREE = LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="$(BUILD)/?.so;;"

all: $(CORE_SO) $(CHILD)

$(BUILD)/obj/%.o: core/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(MJ_CFLAGS) $(INCLUDES) -MMD -MP -c $< -o $@

-include $(C_DEPS)

$(CORE_SO): $(CORE_OBJ) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(LIBFLAG) $(LDFLAGS) -o $@ $(CORE_OBJ) $(UV_LIBS) -ldl

$(CHILD): $(CHILD_OBJ) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(MJ_CFLAGS) $(LDFLAGS) -rdynamic -o $@ $(CHILD_OBJ) $(LUAJIT_LIB) -lm -ldl

# The flags a build directory was made with, in $(FLAGS_STAMP): everything
# compiled depends on it, and it is rewritten only when the flags change, so a
# build with other flags (make CFLAGS=..., LuaRocks' own, a sanitizer build)
# never reuses objects made with the ones before.
BUILD_FLAGS = $(subst ','\'',$(CC) $(MJ_CFLAGS) $(LIBFLAG) $(LDFLAGS) $(UV_LIBS) $(LUAJIT_LIB))
.PHONY: flags-check
flags-check:
$(FLAGS_STAMP): flags-check
	@mkdir -p $(dir $@)
	@printf '%s\n' '$(BUILD_FLAGS)' | cmp -s - $@ || printf '%s\n' '$(BUILD_FLAGS)' > $@

# Installs the Debian packages moonjob needs, when some are missing; the
# bench's own (BENCH_PACKAGES: GNU parallel, which bench/datasets.lua runs
# against) only for make bench.
BENCH_PACKAGES = parallel
define install_missing
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
endef
deps:
	$(call install_missing,$(DEB_PACKAGES))

# The dashboard's browser spec (spec/browser/): Node and npm, Debian's unless
# a node and npm are there already (a nodejs package from elsewhere conflicts
# with Debian's npm), and puppeteer-core at the version package-lock.json
# pins (npm ci: it downloads no browser; Debian's chromium is in DEB_PACKAGES).
NODE_PACKAGES = nodejs npm
browser-deps: deps
	@command -v npm >/dev/null 2>&1 || { echo "installing Debian packages: $(NODE_PACKAGES)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(NODE_PACKAGES); }
	@test -d spec/browser/node_modules/puppeteer-core || npm ci --prefix spec/browser --no-audit --no-fund
bench-deps:
	$(call install_missing,$(BENCH_PACKAGES))

# BullMQ, which bench/life.lua runs next to moonjob: the exact version of
# bench/bullmq/package-lock.json. Without npm, nothing (the bench says BullMQ
# was skipped); a failed download leaves BullMQ out, not the rest of the bench.
bullmq-deps:
	@if ! command -v npm >/dev/null 2>&1; then echo "bullmq-deps: npm not found; the bench leaves BullMQ out"; \
	elif [ ! -d bench/bullmq/node_modules ]; then npm ci --prefix bench/bullmq --no-audit --no-fund \
	  || echo "bullmq-deps: npm ci failed; the bench leaves BullMQ out"; fi

# Programs the specs need: a C program embedding LuaJIT (the spec that closes
# many Lua states) and a library that makes one set-up call of the child fail
# (the sandbox spec: the child must fail closed).
SPEC_HOST  = $(BUILD)/spec-states $(BUILD)/spec-failing.so
spec-host: $(SPEC_HOST)
$(BUILD)/spec-states: spec/support/host/states.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) -I$(LUA_INCDIR) $(LDFLAGS) -o $@ spec/support/host/states.c $(LUAJIT_LIB)
$(BUILD)/spec-failing.so: spec/support/host/failing.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) -fPIC -shared $(LDFLAGS) -o $@ spec/support/host/failing.c -ldl

# Debian's nginx with the Lua module, for the OpenResty spec
# (spec/openresty/): downloaded with apt-get download (no root needed) into
# $(OPENRESTY_DIR)/debs and unpacked with dpkg -x into $(OPENRESTY_DIR)/root,
# never installed: installing libnginx-mod-http-lua replaces the system's
# LuaJIT (libluajit-5.1-2, which moonjob builds with) by OpenResty's
# (libluajit2-5.1-2), the only one the module runs on. The spec runs nginx
# from there with LD_LIBRARY_PATH on the unpacked libraries
# (spec/support/openresty.lua). The shared libraries nginx and the module
# link (OPENRESTY_LIBS) are fetched too when not installed. The package lists
# are kept in $(OPENRESTY_DIR)/packages: a change of them fetches again.
# When apt-get knows no such package, its lists are updated once (sudo when
# not root), as make deps does.
OPENRESTY_DIR      = build/openresty
OPENRESTY_PACKAGES = nginx libnginx-mod-http-lua libnginx-mod-http-ndk lua-resty-core \
                     lua-resty-lrucache libluajit2-5.1-2 libluajit2-5.1-common lua-nginx-redis
OPENRESTY_LIBS     = libcrypt1 libpcre2-8-0 libpcre3 libssl3 zlib1g libgcc-s1
openresty-deps:
	@want='$(OPENRESTY_PACKAGES) $(OPENRESTY_LIBS)'; \
	if [ "$$(cat $(OPENRESTY_DIR)/packages 2>/dev/null)" = "$$want" ] && [ -x $(OPENRESTY_DIR)/root/usr/sbin/nginx ]; then exit 0; fi; \
	rm -rf $(OPENRESTY_DIR) && mkdir -p $(OPENRESTY_DIR)/debs $(OPENRESTY_DIR)/root || exit 1; \
	get='$(OPENRESTY_PACKAGES)'; \
	for p in $(OPENRESTY_LIBS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || get="$$get $$p"; \
	done; \
	echo "downloading Debian packages into $(OPENRESTY_DIR)/debs (not installed): $$get"; \
	cd $(OPENRESTY_DIR)/debs || exit 1; \
	if ! apt-get download -q $$get; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && apt-get download -q $$get || exit 1; \
	fi; \
	for d in *.deb; do dpkg -x "$$d" ../root || exit 1; done; \
	cd ../root && test -x usr/sbin/nginx && test -f usr/lib/nginx/modules/ngx_http_lua_module.so || exit 1; \
	echo "$$want" > ../packages

# Valkey 8, the Redis fork, for `make test-valkey`: valkey-server and
# valkey-cli (both in valkey-tools; valkey-server adds the name) downloaded
# from bookworm-backports with apt-get download (no root needed) into
# $(VALKEY_DIR)/debs and unpacked with dpkg -x into $(VALKEY_DIR)/root, never
# installed; the shared libraries it links (VALKEY_LIBS, all from bookworm:
# redis-tools needs the same, so make deps has them) too when not installed.
# Debian 12 has backports in no source list by default: apt-get must know it
# (a `bookworm-backports` suite beside the Debian source's `bookworm`, as
# .ci/run adds for its run), else this fails and says so; test-valkey then
# skips. No update of apt's lists is made here.
VALKEY_DIR      = build/valkey
VALKEY_PACKAGES = valkey-server valkey-tools
VALKEY_LIBS     = libatomic1 libjemalloc2 liblzf1 libssl3 libsystemd0 libstdc++6
VALKEY_BIN      = $(CURDIR)/$(VALKEY_DIR)/root/usr/bin
VALKEY_ENV      = LD_LIBRARY_PATH="$$(ls -d $(CURDIR)/$(VALKEY_DIR)/root/usr/lib/*-linux-gnu* \
                  $(CURDIR)/$(VALKEY_DIR)/root/lib/*-linux-gnu* 2>/dev/null | tr '\n' :)$$LD_LIBRARY_PATH"
valkey-deps:
	@want='$(VALKEY_PACKAGES) $(VALKEY_LIBS)'; \
	if [ "$$(cat $(VALKEY_DIR)/packages 2>/dev/null)" = "$$want" ] && [ -x $(VALKEY_BIN)/valkey-server ]; then exit 0; fi; \
	rm -rf $(VALKEY_DIR) && mkdir -p $(VALKEY_DIR)/debs $(VALKEY_DIR)/root || exit 1; \
	get='$(VALKEY_PACKAGES)'; \
	for p in $(VALKEY_LIBS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || get="$$get $$p"; \
	done; \
	echo "downloading Debian packages into $(VALKEY_DIR)/debs (not installed): $$get"; \
	cd $(VALKEY_DIR)/debs || exit 1; \
	if ! apt-get download -q $$get; then \
	  echo "valkey-deps: apt-get cannot download them: is bookworm-backports among apt's suites?" >&2; exit 1; \
	fi; \
	for d in *.deb; do dpkg -x "$$d" ../root || exit 1; done; \
	cd $(CURDIR) && $(VALKEY_ENV) $(VALKEY_BIN)/valkey-server --version && echo "$$want" > $(VALKEY_DIR)/packages

# The suite runs as several busted processes at once, a spec file each
# (spec/support/parallel_run.lua: longest first, one log per file, shown when
# it fails), and ends with one line, "N passed, N failed". SPEC_JOBS sets how
# many run at once; `make test SPECS=spec/redis` runs a part.
SPECS      ?= spec
PARALLEL   = $(LUA) spec/support/parallel_run.lua
test: deps browser-deps openresty-deps all spec-host
	$(PARALLEL) --busted "$(BUSTED)" $(SPECS)

# The specs that talk to a server (the Redis queue's, the dashboard's, the
# command line's and the producers' on it, OpenResty's too) with Valkey 8 as the server
# (VALKEY_SPECS; MOONJOB_REDIS_SERVER: spec/support/redis_server.lua), as
# parallel busted processes as make test runs them. Without the unpacked
# valkey-server (make valkey-deps), it says so and skips. The libraries
# valkey-deps unpacked, if any, are found through LD_LIBRARY_PATH.
VALKEY_SPECS ?= spec/redis spec/dashboard spec/openresty spec/cli/raw_spec.lua spec/core/secrets_spec.lua
test-valkey: deps openresty-deps all spec-host
	@if [ ! -x $(VALKEY_BIN)/valkey-server ]; then \
	  echo "test-valkey: skipped: no $(VALKEY_BIN)/valkey-server (make valkey-deps gets it from bookworm-backports)"; exit 0; fi; \
	echo "test-valkey: $$($(VALKEY_ENV) $(VALKEY_BIN)/valkey-server --version)"; \
	$(VALKEY_ENV) MOONJOB_REDIS_SERVER=$(VALKEY_BIN)/valkey-server MOONJOB_REDIS_CLI=$(VALKEY_BIN)/valkey-cli \
	  $(PARALLEL) --busted "$(BUSTED)" $(VALKEY_SPECS)

# The inner loop: every spec but those tagged #slow (Redis, the REPL,
# installing, the command line end to end, a few long waits): under 30 s.
test-fast: deps all spec-host
	$(PARALLEL) --busted "$(BUSTED)" --exclude-tags=slow $(SPECS)

# Three workers in network namespaces on one Redis, killed, cut off, stopped,
# and Redis killed and restarted: every job completes exactly once; a
# queue paused under three workers on two hosts stops within a second; and
# three workers on six queues of a Redis Cluster while a primary is killed,
# a node added and a queue's slot moved: every job completes (needs root).
chaos: deps all
	$(BUSTED) chaos/

# The whole suite on a build with AddressSanitizer and UndefinedBehaviorSanitizer,
# in its own directory. The child program is fully instrumented; the parent's
# core.so runs inside the uninstrumented luajit, so the ASan runtime is
# preloaded into luajit only (spec/support/helpers.lua takes LD_PRELOAD out of the
# environment of the shells and tools the specs start, and puts it back for
# the luajit commands they run, through MOONJOB_PRELOAD). Every finding is
# written under $(SAN_BUILD)/logs, in the parent or in any child, and counts
# as a failure of the run (parallel_run.lua --findings). LeakSanitizer is
# off: LuaJIT's heap is mmap'd memory it does not scan, so every C
# allocation referenced only from a Lua object (a process's buffers,
# lua-cjson's) reads as a leak when a program ends with os.exit, a false
# report by construction. In this build the child skips its RLIMIT_DATA
# backstop (ASan's shadow memory does not fit under it); memory_limit is still enforced by the
# counting allocator, which is what the specs check.
SAN_BUILD  = build-sanitize
SAN_FLAGS  = -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
SAN_RT     = $$($(CC) -print-file-name=libasan.so)
SAN_LOGS   = $(CURDIR)/$(SAN_BUILD)/logs
SAN_ENV    = ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:log_path=$(SAN_LOGS)/asan \
             UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(SAN_LOGS)/ubsan \
             MOONJOB_CPATH="$(SAN_BUILD)/?.so" MOONJOB_PRELOAD=$(SAN_RT)

# (all: the plain build too, for the one process a spec runs without the
# sanitizers: a worker under libfaketime, which hangs beside ASan's runtime)
sanitize: deps browser-deps openresty-deps all
	$(MAKE) BUILD=$(SAN_BUILD) CFLAGS="$(SAN_FLAGS)" LDFLAGS="-fsanitize=address,undefined" all spec-host
	rm -rf $(SAN_LOGS) && mkdir -p $(SAN_LOGS)
	$(SAN_ENV) $(PARALLEL) --findings $(SAN_LOGS) \
	  --busted "LD_PRELOAD=$(SAN_RT) $(LUA) /usr/bin/busted --cpath='$(SAN_BUILD)/?.so'" $(SPECS)

# Runs the example processor over the example NDJSON file (one line fails on
# purpose, so the command's exit status 1 is expected and shown, not fatal).
demo: deps all
	$(IN_TREE) $(LUA) scripts/moonjob run -j 2 examples/square.lua examples/numbers.ndjson; \
	  echo "moonjob exited with status $$? (1: some job failed, as line 6 and 7 do on purpose)"

# The LuaJIT REPL with moonjob on the paths (try require "moonjob"), through rlwrap when it is
# installed and input is a terminal (line editing, history in
# ~/.luajit_history); without rlwrap, a hint says how to get it.
repl: deps all
	@if [ -t 0 ] && command -v rlwrap >/dev/null 2>&1; then exec env $(IN_TREE) rlwrap $(LUA); fi; \
	command -v rlwrap >/dev/null 2>&1 || \
	  echo "make repl: no line editing or history without rlwrap; to get them: apt-get install rlwrap" >&2; \
	exec env $(IN_TREE) $(LUA)

$(BUILD)/bench-floor: bench/floor.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) -o $@ bench/floor.c

bench: deps bench-deps bullmq-deps all $(BUILD)/bench-floor
	$(LUA) bench/run.lua
	$(LUA) bench/cli.lua
	$(LUA) bench/datasets.lua
	$(LUA) bench/life.lua
	$(LUA) bench/steps.lua
	$(LUA) bench/redis.lua
	$(LUA) bench/flows.lua
	$(LUA) bench/producer.lua
	$(LUA) bench/dashboard.lua
	$(LUA) bench/cluster.lua
	$(LUA) bench/failover.lua

# Modules an older layout installed and this one has not, removed by
# install: pool.lua and cli.lua would be found before pool/init.lua and
# cli/init.lua, the others are dead weight. Only these: the folder may hold
# files another installer (LuaRocks) keeps track of.
OLD_LUA_FILES = pool.lua cli.lua cli_args.lua cli_progress.lua cli_batches.lua cli_redis.lua \
                queue.lua runner.lua lines.lua redis/queue.lua pool/lifecycle.lua \
                pool/supervise.lua pool/pipeline.lua redis/functions.lua worker.lua \
                tagged_output.lua pool/stats.lua

# Installs the Lua modules in LUADIR, the core and the child program in
# LIBDIR/moonjob (the core finds the child beside itself) and the command in
# BINDIR (it finds the modules from its own real location, through symlinks).
# Builds first, with the flags of this command line.
install: all
	cd "$(DESTDIR)$(LUADIR)/moonjob" 2>/dev/null && rm -f $(OLD_LUA_FILES) || true
	install -d $(DESTDIR)$(LUADIR)/moonjob $(DESTDIR)$(LIBDIR)/moonjob $(DESTDIR)$(BINDIR)
	for f in $(LUA_FILES); do install -D -m 644 $$f $(DESTDIR)$(LUADIR)/$${f#lua/} || exit 1; done
	install -m 755 $(CORE_SO) $(CHILD) $(DESTDIR)$(LIBDIR)/moonjob/
	install -m 755 scripts/moonjob $(DESTDIR)$(BINDIR)/moonjob

uninstall:
	rm -rf $(DESTDIR)$(LUADIR)/moonjob $(DESTDIR)$(LIBDIR)/moonjob $(DESTDIR)$(BINDIR)/moonjob

# A source rock of this checkout, $(ROCK_DIR)/moonjob-scm-1.src.rock, for
# `luarocks build` or `luarocks install` anywhere, offline. The rockspec's
# source.url cannot name a checkout (LuaRocks resolves a relative one in its
# own temporary directory), so this writes a copy of the rockspec whose url is
# this checkout's absolute path, and packs that: the rock holds the last
# commit (git clone), not uncommitted changes, which are listed if any.
ROCK_DIR   = build-rock
LUAROCKS   = luarocks --lua-version=5.1
.PHONY: rock
rock:
	rm -rf $(ROCK_DIR) && mkdir -p $(ROCK_DIR)
	sed 's|^  url = .*|  url = "git+file://$(CURDIR)",|' moonjob-scm-1.rockspec > $(ROCK_DIR)/moonjob-scm-1.rockspec
	grep -q '^  url = "git+file://$(CURDIR)",$$' $(ROCK_DIR)/moonjob-scm-1.rockspec
	cd $(ROCK_DIR) && $(LUAROCKS) pack moonjob-scm-1.rockspec
	@if [ -n "$$(git status --porcelain --untracked-files=no)" ]; then \
	  echo "note: uncommitted changes are not in the rock:"; git status --short --untracked-files=no; fi

clean:
	rm -rf $(BUILD) $(SAN_BUILD) build-luarocks $(ROCK_DIR)
