/*
 * The body of every fake driver library other than libnvidia-ml (libcuda.so.1, libGLX_nvidia.so.0,
 * ...). tools/fake-node compiles this once and links it many times with a different -soname, so each
 * library is a real ELF shared object with the real driver's DT_SONAME; nothing calls into it.
 */
#define API __attribute__((visibility("default")))

API const char *fake_nvidia_driver_stub(void) {
    return "fake NVIDIA driver library (gpuhook tests)";
}
