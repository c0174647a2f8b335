// ZS_HOST_DEVICE marks the small inline functions that define the kernels'
// element-wise arithmetic, so the CUDA versions compile the very same code.
#ifndef ZSHARD_KERNELS_HOST_DEVICE_H_
#define ZSHARD_KERNELS_HOST_DEVICE_H_

#ifdef __CUDACC__
#define ZS_HOST_DEVICE __host__ __device__
#else
#define ZS_HOST_DEVICE
#endif

#endif  // ZSHARD_KERNELS_HOST_DEVICE_H_
