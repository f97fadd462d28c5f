/* A stand-in for the CUDA driver's library (libcuda.so.1) in presence_test: cuDeviceGetCount answers
 * CUDA_ERROR_NOT_INITIALIZED (3) until fakeCuInit() is called, then as an initialised driver with
 * one device, as the real one does before and after cuInit. */
static int initialised = 0;

void fakeCuInit(void) { initialised = 1; }

int cuDeviceGetCount(int* count) {
  if (!initialised) return 3;
  *count = 1;
  return 0;
}
