# SPDX-License-Identifier: Apache-2.0
# weightfs — non-recursive build. `make` builds everything into $(B)/; `make check` runs the test suite;
# `make demo` runs the real-weights job; `make bench` the side-by-side benchmark; `make asan` the
# sanitizer build of the suite, `make tsan` ThreadSanitizer over the daemon's suites, `make lint`
# cppcheck and shellcheck, `make deb` a Debian package; WERROR=1 makes every warning an error (.ci/run). Dependencies come from
# pkg-config; libfuse >= 3.17 is built from Debian's source package when the system one is older
# (.ci/build-libfuse).

B        ?= build
# The one version number: VERSION, read here for the binaries and man pages and by the Python package.
VERSION  := $(shell cat VERSION)
.DEFAULT_GOAL := all
PREFIX   ?= /usr/local
DESTDIR  ?=
CC       ?= cc
PYTHON   ?= python3

WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 -Wvla \
            -Wwrite-strings
# WERROR=1: a warning fails the build (.ci/run sets it, so the tree stays at zero warnings).
WERROR   ?= 0
ifeq ($(WERROR),1)
WARN     += -Werror
endif
# CFLAGS/LDFLAGS are the user's (optimisation, sanitizers); what the code needs is in WFS_CFLAGS.
CFLAGS   ?= -O2 -g
WFS_CFLAGS := -std=c17 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -pthread $(WARN) -Ilib -MMD -MP
override CFLAGS += $(WFS_CFLAGS)
override LDFLAGS += -pthread

PKGS_LIB := sqlite3 libxxhash jansson
LIB_CFLAGS := $(shell pkg-config --cflags $(PKGS_LIB))
LIB_LIBS   := $(shell pkg-config --libs $(PKGS_LIB))
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS   := $(shell pkg-config --libs check 2>/dev/null)

# libfuse: $(B)/fuse.mk holds FUSE_CFLAGS/FUSE_LIBS, made once by .ci/build-libfuse.
ifeq ($(filter clean distclean lint,$(MAKECMDGOALS)),)
-include $(B)/fuse.mk
endif
$(B)/fuse.mk: .ci/build-libfuse
	@mkdir -p $(B)
	@pc=$$(.ci/build-libfuse) && \
	{ echo "FUSE_CFLAGS := $$(PKG_CONFIG_PATH=$$pc pkg-config --cflags fuse3)"; \
	  echo "FUSE_LIBS := $$(PKG_CONFIG_PATH=$$pc pkg-config --static --libs fuse3)"; } > $@.tmp && mv $@.tmp $@

# CUDA: optional. GPU staging is compiled in when CUDA_HOME (default /usr/local/cuda) has the runtime's
# headers, unless WFS_CUDA=0. Nothing links the runtime: lib/cudart.c loads libcudart.so.N at run time,
# where staging needs it, so the daemon and weightfsctl start on a node without CUDA.
CUDA_HOME ?= /usr/local/cuda
ifneq ($(wildcard $(CUDA_HOME)/include/cuda_runtime.h),)
ifneq ($(WFS_CUDA),0)
CUDA_CFLAGS := -DWFS_HAVE_CUDA=1 -I$(CUDA_HOME)/include -DWFS_CUDART_DIR='"$(CUDA_HOME)/lib64"'
endif
endif
NUMA_LIBS := -lnuma

# ---- lib/: libweightfs.a (usable without FUSE) -------------------------------------------------
LIB_SRCS := $(wildcard lib/*.c)
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/%.o)
$(B)/lib/%.o: lib/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) $(CUDA_CFLAGS) -fPIC -c -o $@ $<
$(B)/libweightfs.a: $(LIB_OBJS)
	$(AR) rcs $@ $^
ALL_LIBS = $(B)/libweightfs.a $(LIB_LIBS) $(NUMA_LIBS) -lm

# ---- fs/: the daemon and the admin command -----------------------------------------------------
CTL_SRCS    := $(wildcard fs/ctl/*.c)
CTL_OBJS    := $(CTL_SRCS:%.c=$(B)/%.o)
# fs/core/: the daemon's state machines. Compiled without libfuse's headers, which keeps it FUSE-free;
# libwfscore.a links into the daemon and into tests/check_core.
CORE_SRCS   := $(wildcard fs/core/*.c)
CORE_OBJS   := $(CORE_SRCS:%.c=$(B)/%.o)
$(CORE_OBJS): $(B)/fs/core/%.o: fs/core/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) -iquote fs/core -c -o $@ $<
$(B)/libwfscore.a: $(CORE_OBJS)
	$(AR) rcs $@ $^
DAEMON_SRCS := $(filter-out $(CTL_SRCS),$(wildcard fs/*.c))
DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(B)/%.o)
$(DAEMON_OBJS): $(B)/fs/%.o: fs/%.c $(B)/fuse.mk
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) $(FUSE_CFLAGS) -Ifs -iquote fs/core -c -o $@ $<
# The objects that print the version (--version, the stats' server line) are rebuilt when it changes.
$(B)/fs/weightfs.o $(B)/fs/xattr.o $(B)/fs/ctl/weightfsctl.o: VERSION
$(B)/fs/weightfs.o $(B)/fs/xattr.o $(B)/fs/ctl/weightfsctl.o: override CFLAGS += -DWFS_VERSION='"$(VERSION)"'
$(B)/weightfs: $(DAEMON_OBJS) $(B)/libwfscore.a $(B)/libweightfs.a
	$(CC) $(LDFLAGS) -rdynamic -o $@ $(DAEMON_OBJS) $(B)/libwfscore.a $(ALL_LIBS) $(FUSE_LIBS)
$(CTL_OBJS): $(B)/fs/%.o: fs/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) $(CUDA_CFLAGS) -Ifs -c -o $@ $<
$(B)/weightfsctl: $(CTL_OBJS) $(B)/libweightfs.a
	$(CC) $(LDFLAGS) -o $@ $(CTL_OBJS) $(ALL_LIBS)

# Shared library for the Python binding (ctypes).
$(B)/libweightfs.so: $(LIB_OBJS)
	$(CC) $(LDFLAGS) -shared -o $@ $^ $(LIB_LIBS) $(NUMA_LIBS) -lm

# Man pages: docs/*.8 with the version in the .TH footer ("weightfs" -> "weightfs VERSION"); the
# sources name no version, so `man -l docs/weightfs.8` reads well too.
MANS := $(patsubst docs/%,$(B)/man/%,$(wildcard docs/*.8))
$(B)/man/%.8: docs/%.8 VERSION
	@mkdir -p $(@D)
	sed '1s/^\(\.TH .*\) "weightfs" /\1 "weightfs $(VERSION)" /' $< > $@

PROGS := $(B)/weightfs $(B)/weightfsctl $(B)/libweightfs.so

# ---- tests/ ------------------------------------------------------------------------------------
TEST_SRCS := $(wildcard tests/check_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(B)/tests/%)
$(B)/tests/%: tests/%.c tests/testutil.h tests/mountutil.h $(B)/libweightfs.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) $(CUDA_CFLAGS) $(CHECK_CFLAGS) -Itests -o $@ $< $(ALL_LIBS) $(CHECK_LIBS)
# The daemon core's suite links the core, not libfuse.
$(B)/tests/check_core: tests/check_core.c tests/testutil.h $(B)/libwfscore.a $(B)/libweightfs.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) $(CHECK_CFLAGS) -Itests -iquote fs/core -o $@ $< $(B)/libwfscore.a $(ALL_LIBS) $(CHECK_LIBS)

# The safetensors header parser's fuzz target: replayed over its corpus by `make check` (built with
# $(CC)); `make fuzz` runs it under libFuzzer (clang) for FUZZ_SECONDS, new inputs in $(B)/fuzz/.
# FUZZ_JANSSON links another jansson, e.g. one built with -fsanitize=fuzzer-no-link,address so the
# fuzzer sees the JSON parser's coverage too: FUZZ_JANSSON="-I/path/include /path/libjansson.a".
FUZZ_REPLAY := $(B)/tests/fuzz_replay
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_JANSSON ?= $(shell pkg-config --cflags --libs jansson)
$(B)/tests/fuzz/%.o: tests/fuzz/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) -c -o $@ $<
$(FUZZ_REPLAY): $(B)/tests/fuzz/replay.o $(B)/tests/fuzz/fuzz_safetensors.o $(B)/libweightfs.a
	$(CC) $(LDFLAGS) -o $@ $(B)/tests/fuzz/replay.o $(B)/tests/fuzz/fuzz_safetensors.o $(ALL_LIBS)
$(B)/fuzz/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c lib/safetensors.c lib/safetensors.h lib/dtype.c lib/dtype.h
	@mkdir -p $(@D)
	$(FUZZ_CC) -g -O1 -std=c17 -D_GNU_SOURCE -Ilib -fsanitize=fuzzer,address,undefined \
		-o $@ tests/fuzz/fuzz_safetensors.c lib/safetensors.c lib/dtype.c $(FUZZ_JANSSON)

.PHONY: all check asan tsan lint demo bench install uninstall clean fuzz posix deb
all: $(PROGS) $(MANS)

# The suite: Check unit suites, mount tests against a real mount, a small real-weights check.
check: $(PROGS) $(MANS) $(TEST_BINS) $(FUZZ_REPLAY)
	@tests/run-tests $(B)

# The same suite under AddressSanitizer and UndefinedBehaviorSanitizer, in its own build directory.
# Sanitized code runs slower: Check's per-test timeouts are tripled.
asan:
	CK_TIMEOUT_MULTIPLIER=3 $(MAKE) B=build-asan \
		CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" \
		LDFLAGS="-fsanitize=address,undefined" check

# ThreadSanitizer over the daemon's threads: the core's suite, the mount suite in both passthrough
# modes, the concurrent stress test, the cli/tools scripts and the direct path's suite (the daemon and
# weightfsctl under test are build-tsan's; python loads build/'s libweightfs.so), in its own build
# directory; tests/run-tsan runs them and fails on any report (tests/tsan.supp: libfuse's known
# reports only).
TSAN_B := build-tsan
tsan:
	$(MAKE) B=build build/libweightfs.so
	$(MAKE) B=$(TSAN_B) CFLAGS="-O1 -g -fsanitize=thread -fno-omit-frame-pointer" \
		LDFLAGS="-fsanitize=thread" $(TSAN_B)/weightfs $(TSAN_B)/weightfsctl $(TSAN_B)/libweightfs.so \
		$(patsubst docs/%,$(TSAN_B)/man/%,$(wildcard docs/*.8)) $(TSAN_B)/tests/check_core \
		$(TSAN_B)/tests/check_mount
	@tests/run-tsan $(TSAN_B)

# cppcheck on lib/ and fs/ (once without and once with the CUDA runtime's code), mypy on the Python
# package, shellcheck on every shell script of .ci/, tests/ and mount-helpers/ (.shellcheckrc). Any finding fails; false positives
# are suppressed inline with their reason, or in tests/lint/cppcheck-suppressions.xml (whole checks;
# files under rewrite). `information` makes a stale suppression a finding too. mypy checks the Python
# package's annotations against the interpreter the tests use (torch and numpy installed there).
CPPCHECK ?= cppcheck
SHELLCHECK ?= shellcheck
MYPY ?= mypy
CPPCHECK_FLAGS := -q --std=c11 -D_GNU_SOURCE -Ilib -Ifs -Ifs/core --inline-suppr --error-exitcode=1 \
	--enable=warning,style,performance,portability,information --suppress=missingIncludeSystem \
	--library=tests/lint/jansson.cfg --suppress-xml=tests/lint/cppcheck-suppressions.xml \
	--template='{file}:{line}: {severity} {id}: {message}'
SHELL_SCRIPTS = $(shell grep -rlIE '^(\#!.*[/ ](ba)?sh$$|\# shellcheck shell=)' .ci tests mount-helpers packaging | sort)
lint:
	$(CPPCHECK) $(CPPCHECK_FLAGS) lib fs
	$(CPPCHECK) $(CPPCHECK_FLAGS) -DWFS_HAVE_CUDA=1 lib fs
	$(SHELLCHECK) $(SHELL_SCRIPTS)
	cd lib/python && $(MYPY) --python-executable /usr/bin/python3 --no-error-summary weightfs

fuzz: $(B)/fuzz/fuzz_safetensors
	@mkdir -p $(B)/fuzz/corpus $(B)/fuzz/artifacts
	$(B)/fuzz/fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) -dict=tests/fuzz/safetensors.dict \
		-artifact_prefix=$(B)/fuzz/artifacts/ $(B)/fuzz/corpus tests/fuzz/corpus

# fsx, fsstress (+ fsck) and pjdfstest against a real mount (root; ../shared/peers; docs/posix.md).
posix: $(PROGS)
	@tests/posix/run-suites $(B)

demo: $(PROGS)
	@tests/demo/run-demo $(B)

bench: $(PROGS)
	@tests/bench/run-bench $(B)

# mount.fuse.weightfs runs the weightfs installed with it ($(PREFIX)/bin); umount.fuse.weightfs waits
# for the daemon to close its store after an unmount by root. The systemd unit is an example
# for one site's mount point (its name must be the escaped path), so it goes with the documentation.
MOUNT_UNIT_EXAMPLE := data-skyrl-frozen\x2doffload.mount
EXAMPLES_DIR := $(PREFIX)/share/doc/weightfs/examples
install: $(PROGS) $(MANS)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man8
	install -m 0755 $(B)/weightfs $(B)/weightfsctl $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(PREFIX)/lib
	install -m 0644 $(B)/libweightfs.so $(DESTDIR)$(PREFIX)/lib/
	install -d $(DESTDIR)$(PREFIX)/sbin $(DESTDIR)$(EXAMPLES_DIR)
	sed 's|^bindir=$$|bindir=$(PREFIX)/bin|' mount-helpers/mount.fuse.weightfs \
		> $(DESTDIR)$(PREFIX)/sbin/mount.fuse.weightfs
	chmod 0755 $(DESTDIR)$(PREFIX)/sbin/mount.fuse.weightfs
	install -m 0755 mount-helpers/umount.fuse.weightfs $(DESTDIR)$(PREFIX)/sbin/
	install -m 0644 'mount-helpers/$(MOUNT_UNIT_EXAMPLE)' $(DESTDIR)$(EXAMPLES_DIR)/
	install -m 0644 $(MANS) $(DESTDIR)$(PREFIX)/share/man/man8/

# make deb: $(B)/weightfs_VERSION_ARCH.deb, built with dpkg-deb from what `make install PREFIX=/usr`
# stages in $(B)/deb/debian/weightfs, plus the Python package in /usr/lib/python3/dist-packages (its
# loader finds /usr/lib/libweightfs.so). dpkg-shlibdeps reads the shared libraries' dependencies.
# As Debian policy asks: binaries stripped, man pages gzipped, and /usr/share/doc/weightfs holds the
# copyright file (packaging/deb/copyright, machine-readable), a changelog.gz and NEWS.md.gz.
# tests/deb/test_deb.sh installs it in a throwaway root.
# The Maintainer field: DEBFULLNAME <DEBEMAIL>, as Debian's own tools read them, else the author of
# the tree's last commit. The changelog entry is dated by SOURCE_DATE_EPOCH, else by that commit, so
# two builds of one tree make the same package.
DEB_MAINTAINER ?= $(if $(DEBEMAIL),$(DEBFULLNAME) <$(DEBEMAIL)>,$(shell git log -1 --format='%an <%ae>' 2>/dev/null))
DEB_DATE_EPOCH ?= $(or $(SOURCE_DATE_EPOCH),$(shell git log -1 --format=%ct 2>/dev/null),$(shell date +%s))
DEB_ARCH = $(shell dpkg --print-architecture 2>/dev/null)
DEB := $(B)/weightfs_$(VERSION)_$(DEB_ARCH).deb
DEB_ROOT := $(B)/deb/debian/weightfs
PY_SRCS := $(wildcard lib/python/weightfs/*.py) lib/python/weightfs/py.typed
deb: $(DEB)
$(DEB): $(PROGS) $(MANS) $(PY_SRCS) VERSION NEWS.md Makefile packaging/deb/control.in packaging/deb/prerm \
		packaging/deb/copyright mount-helpers/*.weightfs
	@[ -n '$(DEB_MAINTAINER)' ] || { echo 'make deb: no Maintainer: set DEBEMAIL (and DEBFULLNAME)' >&2; exit 1; }
	rm -rf $(B)/deb
	$(MAKE) --no-print-directory install B=$(B) PREFIX=/usr DESTDIR=$(abspath $(DEB_ROOT))
	strip --strip-unneeded --remove-section=.comment --remove-section=.note \
		$(DEB_ROOT)/usr/bin/weightfs $(DEB_ROOT)/usr/bin/weightfsctl $(DEB_ROOT)/usr/lib/libweightfs.so
	gzip -9n $(DEB_ROOT)/usr/share/man/man8/*.8
	ln -s weightfs.8.gz $(DEB_ROOT)/usr/share/man/man8/mount.fuse.weightfs.8.gz # weightfs(8) describes
	ln -s weightfs.8.gz $(DEB_ROOT)/usr/share/man/man8/umount.fuse.weightfs.8.gz # both helpers
	install -d $(DEB_ROOT)/usr/lib/python3/dist-packages/weightfs $(DEB_ROOT)/DEBIAN
	install -m 0644 $(PY_SRCS) VERSION $(DEB_ROOT)/usr/lib/python3/dist-packages/weightfs/
	install -m 0644 packaging/deb/copyright $(DEB_ROOT)/usr/share/doc/weightfs/
	gzip -9n < NEWS.md > $(DEB_ROOT)/usr/share/doc/weightfs/NEWS.md.gz
	printf 'weightfs (%s) unstable; urgency=medium\n\n  * Built from the weightfs tree; its user-visible changes are in\n    /usr/share/doc/weightfs/NEWS.md.gz.\n\n -- %s  %s\n' \
		'$(VERSION)' '$(DEB_MAINTAINER)' "$$(LC_ALL=C date -u -R -d @$(DEB_DATE_EPOCH))" \
		| gzip -9n > $(DEB_ROOT)/usr/share/doc/weightfs/changelog.gz
	chmod 0644 $(DEB_ROOT)/usr/share/doc/weightfs/*.gz
	touch $(B)/deb/debian/control
	deps=$$(cd $(B)/deb && dpkg-shlibdeps -O debian/weightfs/usr/bin/weightfs \
		debian/weightfs/usr/bin/weightfsctl debian/weightfs/usr/lib/libweightfs.so | sed -n 's/^shlibs:Depends=//p') && \
	size=$$(du -sk --exclude=DEBIAN $(DEB_ROOT) | cut -f1) && \
	sed -e 's/@VERSION@/$(VERSION)/' -e 's/@ARCH@/$(DEB_ARCH)/' -e "s/@DEPENDS@/$$deps/" -e "s/@SIZE@/$$size/" \
		-e 's|@MAINTAINER@|$(DEB_MAINTAINER)|' \
		packaging/deb/control.in > $(DEB_ROOT)/DEBIAN/control
	install -m 0755 packaging/deb/prerm $(DEB_ROOT)/DEBIAN/
	dpkg-deb --root-owner-group --build $(DEB_ROOT) $@

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/weightfs $(DESTDIR)$(PREFIX)/bin/weightfsctl $(DESTDIR)$(PREFIX)/lib/libweightfs.so
	rm -f $(DESTDIR)$(PREFIX)/sbin/mount.fuse.weightfs $(DESTDIR)$(PREFIX)/sbin/umount.fuse.weightfs
	rm -f '$(DESTDIR)$(EXAMPLES_DIR)/$(MOUNT_UNIT_EXAMPLE)'
	rmdir $(DESTDIR)$(EXAMPLES_DIR) $(DESTDIR)$(PREFIX)/share/doc/weightfs 2>/dev/null || true
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/share/man/man8/,$(notdir $(wildcard docs/*.8)))

clean:
	rm -rf $(B) build-asan $(TSAN_B)

-include $(shell find $(B) -name '*.d' 2>/dev/null)
