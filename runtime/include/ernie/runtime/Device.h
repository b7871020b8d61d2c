//===- Device.h - where buffers live and kernels run: host or CUDA -*- C++ -*-===//
//
// One interface for the machines a rank computes on, so that the Executor,
// the Session and the communicators are written once: memory (a function's
// planned arena is one allocation, made once and reused every step; pinned
// host memory for staging), streams and events, copies between host and
// device and on the device, the few data operations the executor and the
// thread engine do themselves (block copies, ordered reductions, element
// conversions), and the kernel table the device dispatches to.
//
// The CPU device (cpuDevice()) is the host itself: its memory is ordinary
// memory, its streams and events are empty handles, every call is done when
// it returns, and its kernels are the CPU kernels (Kernel.h). The CUDA device
// (openDevice("cuda"), built with ERNIE_ENABLE_CUDA) keeps buffers in GPU
// memory and orders its work on streams; its code has not yet run on a GPU
// (see docs/architecture.md, "The CUDA backend": unverified).
//
// Work is ordered on the calling thread's current stream (currentStream(),
// set by a StreamGuard): each rank's executor sets its compute stream, its
// communication thread its communication stream. Kernels read the same
// thread-local stream, so the kernel signature stays the CPU's.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_DEVICE_H
#define ERNIE_RUNTIME_DEVICE_H

#include "ernie/runtime/Communicator.h"
#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/Kernel.h"
#include "ernie/runtime/Program.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ernie::runtime {

/// A device cannot do what was asked: no such device, not enough memory
/// (the message gives both numbers), a driver error.
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class DeviceKind { Cpu, Cuda };

/// Opaque handles: a cudaStream_t / cudaEvent_t on CUDA; null on the CPU,
/// whose work is finished when each call returns.
struct Stream {
  void *handle = nullptr;
};
struct Event {
  void *handle = nullptr;
};

/// A device's memory, in bytes.
struct DeviceMemory {
  uint64_t free = 0, total = 0;
};

class Device {
public:
  virtual ~Device();

  virtual DeviceKind kind() const = 0;
  /// "cpu", "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB)".
  virtual std::string describe() const = 0;
  /// The device's buffers are host memory (the CPU): callers may read them.
  bool hostAddressable() const { return kind() == DeviceKind::Cpu; }

  // Memory.
  /// At least kBufferAlignment-aligned; DeviceError, naming the bytes asked
  /// for and the bytes free, when the device has too little.
  virtual void *allocate(size_t bytes) = 0;
  virtual void deallocate(void *data) noexcept = 0;
  /// Page-locked host memory, for staging inputs (plain memory on the CPU).
  virtual void *allocateStaging(size_t bytes);
  virtual void deallocateStaging(void *data) noexcept;
  /// Free and total bytes, where the device can tell (the CUDA device).
  virtual std::optional<DeviceMemory> memory() const { return std::nullopt; }

  // Streams and events (empty on the CPU).
  virtual Stream createStream() { return {}; }
  virtual void destroyStream(Stream) noexcept {}
  virtual Event createEvent() { return {}; }
  virtual void destroyEvent(Event) noexcept {}
  /// Marks the point `stream` has reached.
  virtual void record(Event, Stream) {}
  /// Later work on `stream` waits for `event`.
  virtual void wait(Stream, Event) {}
  /// Blocks the caller until `stream`'s work is done.
  virtual void synchronize(Stream) {}
  /// Milliseconds between two recorded events, once both are done.
  virtual float elapsedMilliseconds(Event, Event) { return 0; }

  // Data movement, on the calling thread's current stream.
  /// Host bytes to the device; the host buffer may be reused on return.
  virtual void upload(void *dst, const void *host, size_t bytes) = 0;
  /// Device bytes to the host; returns once they are there.
  virtual void download(void *host, const void *src, size_t bytes) = 0;
  /// Within the device; the ranges may overlap (memmove).
  virtual void copy(void *dst, const void *src, size_t bytes) = 0;
  virtual void fill(void *dst, uint8_t byte, size_t bytes) = 0;
  /// HostTensor.h's insertBlock / extractBlock on device buffers.
  virtual void insertBlock(const void *src,
                           const std::vector<int64_t> &blockShape, void *dst,
                           const std::vector<int64_t> &dstShape,
                           const std::vector<int64_t> &offsets,
                           size_t elementBytes) = 0;
  virtual void extractBlock(const void *src,
                            const std::vector<int64_t> &srcShape,
                            const std::vector<int64_t> &offsets, void *dst,
                            const std::vector<int64_t> &blockShape,
                            size_t elementBytes) = 0;
  /// Communicator.h's reduceInOrder on device buffers: the same order and
  /// rounding, so every engine and device gives the same bits.
  virtual void reduceInOrder(const std::vector<const void *> &inputs,
                             const std::vector<void *> &outputs, size_t count,
                             DType type, ReduceOp op) = 0;
  /// n elements converted as ernie.cast converts them.
  virtual void convert(const void *src, DType from, void *dst, DType to,
                       size_t n) = 0;

  // Kernels.
  /// The kernel that runs `inst` (a kernel instruction of a loaded
  /// program) on this device, or null when the device has none for its op;
  /// `holder` keeps a kernel made for this instruction alive (fused bodies).
  virtual const Kernel *kernelFor(const Instruction &inst,
                                  std::shared_ptr<const Kernel> &holder) const = 0;
  /// The ops this device has kernels for, sorted.
  virtual std::vector<std::string> kernelNames() const = 0;
};

/// The host: every op of cpuKernelNames(), buffers in host memory.
Device &cpuDevice();

/// "cpu", "cuda" (device 0, or LOCAL_RANK's when set) or "cuda:N".
/// DeviceError when this build has no CUDA backend ("built without CUDA")
/// or no such device is visible ("no CUDA device visible").
std::shared_ptr<Device> openDevice(const std::string &spec);
/// Whether this build has the CUDA backend (ERNIE_ENABLE_CUDA).
bool cudaBackendBuilt();
/// Visible CUDA devices; 0 without the backend or a device, and then
/// `reason` says why.
int cudaDeviceCount(std::string *reason = nullptr);
/// The ops the CUDA backend has kernels for (ernie.fused included),
/// sorted; empty without the backend. Needs no GPU.
std::vector<std::string> cudaKernelNames();

/// The calling thread's current stream (empty until a StreamGuard sets one:
/// a CUDA device then uses its default stream).
Stream currentStream();
/// Makes `stream` the calling thread's current stream for its lifetime.
class StreamGuard {
public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard &) = delete;
  StreamGuard &operator=(const StreamGuard &) = delete;

private:
  Stream previous_;
};

/// Bytes of a device allocation, owned.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  DeviceBuffer(Device &device, size_t bytes);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer &&other) noexcept { *this = std::move(other); }
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;

  void *data() const { return data_; }
  size_t size() const { return size_; }
  Device *device() const { return device_; }
  /// Grows (never shrinks) to at least `bytes`; the contents are lost.
  void reserve(Device &device, size_t bytes);
  void reset();

private:
  Device *device_ = nullptr;
  void *data_ = nullptr;
  size_t size_ = 0;
};

/// A tensor on a device: a rank's resident state, a pipeline's residuals
/// and gradient sums, a function's results before anyone asks for them.
struct DeviceTensor {
  DType type = DType::F32;
  std::vector<int64_t> shape;
  DeviceBuffer buffer;

  DeviceTensor() = default;
  /// Uninitialised.
  DeviceTensor(Device &device, DType type, std::vector<int64_t> shape);
  static DeviceTensor upload(Device &device, const HostTensor &host);

  bool empty() const { return buffer.device() == nullptr; }
  Device &device() const { return *buffer.device(); }
  int64_t numElements() const { return elementCount(shape); }
  size_t bytes() const { return numElements() * byteSize(type); }
  TensorView view() const { return {buffer.data(), type, shape}; }
  /// A copy on the host (waits for the device).
  HostTensor download() const;
  /// Replaces the contents with `host`'s, of the same type and shape.
  void assign(const HostTensor &host);
};

/// The collectives on host memory whatever memory `comm` carries: staged
/// through its device when its buffers live there (NCCL, the shared-device
/// engine). For control traffic: checkpoint agreement, the pipeline's loss,
/// gathers for --outputs.
void hostAllReduce(Communicator &comm, const void *in, void *out, size_t count,
                   DType type, ReduceOp op, const Axes &axes);
void hostAllGather(Communicator &comm, const void *in, void *out, size_t bytes,
                   const Axes &axes);
void hostBroadcast(Communicator &comm, void *data, size_t bytes,
                   int64_t rootIndex, const Axes &axes);
void hostSend(Communicator &comm, const void *data, size_t bytes, int64_t peer,
              int64_t tag);
void hostRecv(Communicator &comm, void *data, size_t bytes, int64_t peer,
              int64_t tag);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_DEVICE_H
