//===- CudaDevice.cpp - the CUDA device: memory, streams, copies, kernels ---===//
//
// UNVERIFIED ON A GPU: this compiles and links without a GPU (CI), but has
// not run on one; scripts/gpu_check.sh exercises it where a GPU is visible.
//
// One CudaDevice per GPU ordinal, shared by every thread that uses it; CUDA's
// current device is per thread, so every entry point first makes this
// device current on the calling thread. Memory comes from the device's
// stream-ordered pool (cudaMallocAsync with the release threshold raised),
// so the arenas, results and scratch buffers allocated after the first step
// reuse cached memory instead of calling the driver; frees are ordered on
// the calling thread's current stream. Host data moves through a per-thread
// pinned staging buffer in chunks, double-buffered with events.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/Device.h"

#include "kernels/common/Registry.h"
#include "CudaKernels.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

namespace ernie::runtime {

namespace cuda {

cudaStream_t stream() {
  return static_cast<cudaStream_t>(currentStream().handle);
}

void check(cudaError_t status, const char *what) {
  if (status != cudaSuccess)
    throw KernelError(std::string(what) + ": CUDA error " +
                      cudaGetErrorName(status) + ": " +
                      cudaGetErrorString(status));
}

Scratch::Scratch(size_t bytes) {
  check(cudaMallocAsync(&data_, bytes ? bytes : 1, stream()), "scratch memory");
}

Scratch::~Scratch() {
  if (data_)
    cudaFreeAsync(data_, stream());
}

ErrorFlag::ErrorFlag() : flag_(sizeof(int)) {
  check(cudaMemsetAsync(flag_.data(), 0, sizeof(int), stream()), "error flag");
}

int ErrorFlag::raised() const {
  int value = 0;
  check(cudaMemcpyAsync(&value, flag_.data(), sizeof value,
                        cudaMemcpyDeviceToHost, stream()),
        "reading a kernel's error flag");
  check(cudaStreamSynchronize(stream()), "reading a kernel's error flag");
  return value;
}

namespace {
const Registry &registry() {
  static const Registry r = [] {
    Registry r;
    registerElementwiseKernels(r);
    registerLinalgKernels(r);
    registerShapeKernels(r);
    registerTransformerKernels(r);
    registerAttentionKernels(r);
    registerGemmKernels(r);
    return r;
  }();
  return r;
}
} // namespace

const Kernel *findKernel(std::string_view op) {
  auto it = registry().find(op);
  return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> kernelNames() {
  std::vector<std::string> names;
  for (const auto &entry : registry())
    names.push_back(entry.first);
  names.push_back("ernie.fused");
  std::sort(names.begin(), names.end());
  return names;
}

} // namespace cuda

namespace {

using cuda::check;

/// Deviceerrors from the driver, named as such.
void require(cudaError_t status, const std::string &what) {
  if (status != cudaSuccess)
    throw DeviceError(what + ": CUDA error " + cudaGetErrorName(status) + ": " +
                      cudaGetErrorString(status));
}

cudaStream_t raw(Stream s) { return static_cast<cudaStream_t>(s.handle); }
cudaEvent_t raw(Event e) { return static_cast<cudaEvent_t>(e.handle); }

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / 1073741824.0);
  return text;
}

class CudaDevice final : public Device {
public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    makeCurrent();
    cudaDeviceProp prop{};
    require(cudaGetDeviceProperties(&prop, ordinal_), "cudaGetDeviceProperties");
    size_t free = 0, total = 0;
    require(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    description_ = "cuda:" + std::to_string(ordinal_) + " (" + prop.name +
                   ", sm_" + std::to_string(prop.major) +
                   std::to_string(prop.minor) + ", " + gib(total) + ")";
    // Keep freed memory in the pool: after the first step every allocation
    // is served from it.
    cudaMemPool_t pool;
    require(cudaDeviceGetDefaultMemPool(&pool, ordinal_), "the memory pool");
    uint64_t threshold = UINT64_MAX;
    require(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
                                    &threshold),
            "the memory pool");
  }

  DeviceKind kind() const override { return DeviceKind::Cuda; }
  std::string describe() const override { return description_; }

  void *allocate(size_t bytes) override {
    makeCurrent();
    void *data = nullptr;
    cudaError_t status = cudaMallocAsync(&data, bytes ? bytes : 1,
                                         cuda::stream());
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError(); // clear it
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw DeviceError(describe() + ": cannot allocate " +
                        std::to_string(bytes) + " bytes (" + gib(bytes) +
                        "); " + std::to_string(free) + " bytes (" + gib(free) +
                        ") free of " + std::to_string(total));
    }
    require(status, "cudaMallocAsync");
    return data;
  }
  void deallocate(void *data) noexcept override {
    if (!data)
      return;
    makeCurrent();
    cudaFreeAsync(data, cuda::stream());
  }
  void *allocateStaging(size_t bytes) override {
    makeCurrent();
    void *data = nullptr;
    require(cudaMallocHost(&data, bytes ? bytes : 1), "cudaMallocHost");
    return data;
  }
  void deallocateStaging(void *data) noexcept override {
    if (data)
      cudaFreeHost(data);
  }
  std::optional<DeviceMemory> memory() const override {
    makeCurrent();
    size_t free = 0, total = 0;
    require(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return DeviceMemory{free, total};
  }

  Stream createStream() override {
    makeCurrent();
    cudaStream_t s = nullptr;
    require(cudaStreamCreate(&s), "cudaStreamCreate");
    return {s};
  }
  void destroyStream(Stream s) noexcept override {
    if (s.handle) {
      makeCurrent();
      cudaStreamSynchronize(raw(s));
      cudaStreamDestroy(raw(s));
    }
  }
  Event createEvent() override {
    makeCurrent();
    cudaEvent_t e = nullptr;
    require(cudaEventCreate(&e), "cudaEventCreate");
    return {e};
  }
  void destroyEvent(Event e) noexcept override {
    if (e.handle)
      cudaEventDestroy(raw(e));
  }
  void record(Event e, Stream s) override {
    makeCurrent();
    require(cudaEventRecord(raw(e), raw(s)), "cudaEventRecord");
  }
  void wait(Stream s, Event e) override {
    makeCurrent();
    require(cudaStreamWaitEvent(raw(s), raw(e), 0), "cudaStreamWaitEvent");
  }
  void synchronize(Stream s) override {
    makeCurrent();
    require(cudaStreamSynchronize(raw(s)), "cudaStreamSynchronize");
  }
  float elapsedMilliseconds(Event from, Event to) override {
    makeCurrent();
    require(cudaEventSynchronize(raw(to)), "cudaEventSynchronize");
    float ms = 0;
    require(cudaEventElapsedTime(&ms, raw(from), raw(to)),
            "cudaEventElapsedTime");
    return ms;
  }

  void upload(void *dst, const void *host, size_t bytes) override {
    makeCurrent();
    Staging &s = staging();
    const char *from = static_cast<const char *>(host);
    for (size_t done = 0; done < bytes; done += kChunk) {
      size_t n = std::min(kChunk, bytes - done);
      int half = s.next;
      s.next ^= 1;
      // The half may still feed an earlier copy: wait for it.
      require(cudaEventSynchronize(s.used[half]), "staging");
      std::memcpy(s.half(half), from + done, n);
      require(cudaMemcpyAsync(static_cast<char *>(dst) + done, s.half(half), n,
                              cudaMemcpyHostToDevice, cuda::stream()),
              "upload");
      require(cudaEventRecord(s.used[half], cuda::stream()), "staging");
    }
  }
  void download(void *host, const void *src, size_t bytes) override {
    makeCurrent();
    Staging &s = staging();
    char *to = static_cast<char *>(host);
    for (size_t done = 0; done < bytes; done += kChunk) {
      size_t n = std::min(kChunk, bytes - done);
      require(cudaEventSynchronize(s.used[0]), "staging");
      require(cudaMemcpyAsync(s.half(0), static_cast<const char *>(src) + done,
                              n, cudaMemcpyDeviceToHost, cuda::stream()),
              "download");
      require(cudaStreamSynchronize(cuda::stream()), "download");
      std::memcpy(to + done, s.half(0), n);
    }
  }
  void copy(void *dst, const void *src, size_t bytes) override {
    if (!bytes || dst == src)
      return;
    makeCurrent();
    const char *s = static_cast<const char *>(src);
    char *d = static_cast<char *>(dst);
    if (s < d + bytes && d < s + bytes) {
      // cudaMemcpy does not allow overlap: through a scratch copy.
      cuda::Scratch tmp(bytes);
      require(cudaMemcpyAsync(tmp.data(), src, bytes, cudaMemcpyDeviceToDevice,
                              cuda::stream()),
              "copy");
      src = tmp.data();
      require(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                              cuda::stream()),
              "copy");
      return;
    }
    require(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                            cuda::stream()),
            "copy");
  }
  void fill(void *dst, uint8_t byte, size_t bytes) override {
    makeCurrent();
    require(cudaMemsetAsync(dst, byte, bytes, cuda::stream()), "fill");
  }
  void insertBlock(const void *src, const std::vector<int64_t> &blockShape,
                   void *dst, const std::vector<int64_t> &dstShape,
                   const std::vector<int64_t> &offsets,
                   size_t elementBytes) override {
    makeCurrent();
    Placed array = placed(dstShape, offsets);
    cuda::copyStrided(dst, array.base, array.strides, src, 0,
                      cpu::stridesOf(blockShape), blockShape, elementBytes);
  }
  void extractBlock(const void *src, const std::vector<int64_t> &srcShape,
                    const std::vector<int64_t> &offsets, void *dst,
                    const std::vector<int64_t> &blockShape,
                    size_t elementBytes) override {
    makeCurrent();
    Placed array = placed(srcShape, offsets);
    cuda::copyStrided(dst, 0, cpu::stridesOf(blockShape), src, array.base,
                      array.strides, blockShape, elementBytes);
  }
  void reduceInOrder(const std::vector<const void *> &inputs,
                     const std::vector<void *> &outputs, size_t count,
                     DType type, ReduceOp op) override {
    makeCurrent();
    cuda::reduceInOrder(inputs, outputs, count, type, op);
  }
  void convert(const void *src, DType from, void *dst, DType to,
               size_t n) override {
    makeCurrent();
    cuda::convert(src, from, dst, to, n);
  }

  const Kernel *kernelFor(const Instruction &inst,
                          std::shared_ptr<const Kernel> &holder) const override {
    if (inst.op == "ernie.fused") {
      if (!inst.body)
        return nullptr;
      holder = std::make_shared<const Kernel>(cuda::makeFusedKernel(*inst.body));
      return holder.get();
    }
    return cuda::findKernel(inst.op);
  }
  std::vector<std::string> kernelNames() const override {
    return cuda::kernelNames();
  }

private:
  static constexpr size_t kChunk = size_t(8) << 20; // per staging half

  /// Pinned memory for one thread's host copies: two halves, each with the
  /// event of the last copy that read or wrote it.
  struct Staging {
    char *memory = nullptr;
    cudaEvent_t used[2] = {nullptr, nullptr};
    int next = 0;
    char *half(int h) const { return memory + h * kChunk; }
  };

  Staging &staging() {
    thread_local std::map<int, Staging> perDevice; // kept for the thread's life
    Staging &s = perDevice[ordinal_];
    if (!s.memory) {
      require(cudaMallocHost(reinterpret_cast<void **>(&s.memory), 2 * kChunk),
              "pinned staging memory");
      for (cudaEvent_t &e : s.used) {
        require(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                "staging events");
        require(cudaEventRecord(e, nullptr), "staging events");
      }
    }
    return s;
  }

  /// An array's row-major strides and the offset of a block at `offsets`.
  struct Placed {
    std::vector<int64_t> strides;
    int64_t base = 0;
  };
  static Placed placed(const std::vector<int64_t> &shape,
                       const std::vector<int64_t> &offsets) {
    Placed p{cpu::stridesOf(shape), 0};
    for (size_t d = 0; d < offsets.size(); ++d)
      p.base += offsets[d] * p.strides[d];
    return p;
  }

  /// CUDA's current device is per thread; every thread touching this device
  /// selects it first (cheap when it already is).
  void makeCurrent() const {
    thread_local int current = -1;
    if (current != ordinal_) {
      require(cudaSetDevice(ordinal_), "cudaSetDevice");
      current = ordinal_;
    }
  }

  int ordinal_;
  std::string description_;
};

} // namespace

int countCudaDevices(std::string *reason) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    if (reason)
      *reason = std::string("no CUDA device visible (cudaGetDeviceCount: ") +
                (status == cudaSuccess ? "0 devices"
                                       : std::string(cudaGetErrorName(status)) +
                                             ": " + cudaGetErrorString(status)) +
                ")";
    return 0;
  }
  return count;
}

std::vector<std::string> listCudaKernels() { return cuda::kernelNames(); }

std::shared_ptr<Device> openCudaDevice(int ordinal) {
  static std::mutex mutex;
  static std::map<int, std::shared_ptr<Device>> devices;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<Device> &device = devices[ordinal];
  if (!device)
    device = std::make_shared<CudaDevice>(ordinal);
  return device;
}

} // namespace ernie::runtime
