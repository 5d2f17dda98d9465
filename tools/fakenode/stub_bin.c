/*
 * The fake driver executables other than nvidia-smi (nvidia-debugdump, nvidia-persistenced,
 * nvidia-cuda-mps-server, nvidia-cuda-mps-control): one binary, copied under each name. It prints
 * one line naming itself and exits 0.
 */
#include <stdio.h>
#include <string.h>

#ifndef FAKE_DRIVER_VERSION
#define FAKE_DRIVER_VERSION "0.0.0"
#endif

int main(int argc, char **argv) {
    const char *name = argc > 0 && argv[0] ? argv[0] : "nvidia-stub";
    const char *slash = strrchr(name, '/');
    printf("%s (fake NVIDIA driver %s): stub, nothing to do\n", slash ? slash + 1 : name,
           FAKE_DRIVER_VERSION);
    return 0;
}
