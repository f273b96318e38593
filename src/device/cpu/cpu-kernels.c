/* Placeholder kernel table; replaced by the CPU kernel implementation. */
#include "device/cpu/cpu-impl.h"
const pkv_kernel_ops pkv_cpu_kernel_ops = {0};
