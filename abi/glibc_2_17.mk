# The glibc floor of every library mounted into containers (the hook; the simulated libcuda.so.1 and
# libnvidia-ml.so.1 in ../simgpu): no symbol version above GLIBC_2.17, so that tenant images from
# glibc 2.17 on (UBI 8 has 2.28, Ubuntu 20.04 2.31) can load them. Included by ../vgpu_hook/Makefile and
# ../simgpu/Makefile; tests/integration/hook/test_glibc_floor.py checks the result.
#
#   GLIBC_2_17_CFLAGS  force-includes glibc_2_17.h: dl* and pthread_* bound to their glibc
#                      2.17 versions (.symver)
#   GLIBC_2_17_LIBS    libdl.so.2 and libpthread.so.0 as DT_NEEDED even where the linker finds
#                      nothing in them (glibc >= 2.34): on an older glibc those functions live there
#   GLIBC_2_17_DEPS    prerequisites, so that objects and libraries are rebuilt when these change

GLIBC_2_17_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
GLIBC_2_17_H := $(GLIBC_2_17_DIR)/glibc_2_17.h
GLIBC_2_17_CFLAGS := -include $(GLIBC_2_17_H)
GLIBC_2_17_LIBS := -Wl,--push-state,--no-as-needed -l:libdl.so.2 -l:libpthread.so.0 -Wl,--pop-state
GLIBC_2_17_DEPS := $(GLIBC_2_17_H) $(GLIBC_2_17_DIR)/glibc_2_17.mk
