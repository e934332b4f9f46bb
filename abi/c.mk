# What the C parts (vgpu_hook, simgpu) build with: cuda.h and the compiler's flags. Included by
# their Makefiles; PYTHON, CUDA_INCLUDE, CC, CFLAGS and LDFLAGS may be set on the command line.
#
# cuda.h comes from CUDA_INCLUDE if set, else from the nvidia-cuda-runtime wheel importable by
# $(PYTHON) (nvidia.cu13), else from /usr/local/cuda/include.

PYTHON ?= python3
CC ?= cc

ifeq ($(origin CUDA_INCLUDE), undefined)
  CUDA_INCLUDE := $(shell $(PYTHON) -c "import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], 'include'))" 2>/dev/null)
  ifeq ($(wildcard $(CUDA_INCLUDE)/cuda.h),)
    CUDA_INCLUDE := /usr/local/cuda/include
  endif
endif

WARNINGS := -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wstrict-prototypes -Wmissing-prototypes
CFLAGS ?= -O2 -g
LDFLAGS ?=
BASE_CFLAGS := -std=gnu11 $(WARNINGS) $(CFLAGS) -MMD -MP
CUDA_CFLAGS := -isystem $(CUDA_INCLUDE)
