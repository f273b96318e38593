# Cross build for 64-bit ARM Linux with Debian's gcc-aarch64-linux-gnu; ctest
# runs the test binaries under qemu-user (make test-arm). QEMU_CPU=max (set by
# the Makefile; -cpu max here too) gives the emulated CPU dotprod and i8mm, so
# every ARM path of the CPU kernels can be forced and tested.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(PKV_ARM_SYSROOT /usr/aarch64-linux-gnu CACHE PATH "the target's libraries (libc6-dev-arm64-cross)")
set(CMAKE_FIND_ROOT_PATH ${PKV_ARM_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-cpu;max;-L;${PKV_ARM_SYSROOT})
# pkg-config must not hand the host's x86 libraries (jansson, microhttpd) to an
# arm64 link: only .pc files of the target, and there are none by default.
set(ENV{PKG_CONFIG_LIBDIR} ${PKV_ARM_SYSROOT}/lib/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
