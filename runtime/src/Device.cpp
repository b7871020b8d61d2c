//===- Device.cpp - the device interface, the CPU device, device tensors ----===//

#include "ernie/runtime/Device.h"

#include "ernie/runtime/ProgramFormat.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace ernie::runtime {

#ifdef ERNIE_HAVE_CUDA
// CudaDevice.cpp.
std::shared_ptr<Device> openCudaDevice(int ordinal);
int countCudaDevices(std::string *reason);
std::vector<std::string> listCudaKernels();
#endif

std::vector<std::string> cudaKernelNames() {
#ifdef ERNIE_HAVE_CUDA
  return listCudaKernels();
#else
  return {};
#endif
}

Device::~Device() = default;

void *Device::allocateStaging(size_t bytes) {
  return cpuDevice().allocate(bytes);
}

void Device::deallocateStaging(void *data) noexcept {
  cpuDevice().deallocate(data);
}

Device &Communicator::device() const { return cpuDevice(); }

namespace {

/// The host. Every call is finished when it returns, so streams and events
/// are empty handles and the data operations are the runtime's own host
/// functions — exactly what the executor and the thread engine called
/// before devices existed, so the CPU path computes the same bits.
class CpuDevice final : public Device {
public:
  DeviceKind kind() const override { return DeviceKind::Cpu; }
  std::string describe() const override { return "cpu"; }

  void *allocate(size_t bytes) override {
    // Program::load bounds arenas far below where this rounding could wrap.
    if (bytes > SIZE_MAX - program::kBufferAlignment)
      throw std::bad_alloc();
    size_t size = (bytes + program::kBufferAlignment - 1) /
                  program::kBufferAlignment * program::kBufferAlignment;
    void *data = std::aligned_alloc(program::kBufferAlignment,
                                    size ? size : program::kBufferAlignment);
    if (!data)
      throw std::bad_alloc();
    return data;
  }
  void deallocate(void *data) noexcept override { std::free(data); }

  void upload(void *dst, const void *host, size_t bytes) override {
    if (bytes)
      std::memcpy(dst, host, bytes);
  }
  void download(void *host, const void *src, size_t bytes) override {
    if (bytes)
      std::memcpy(host, src, bytes);
  }
  void copy(void *dst, const void *src, size_t bytes) override {
    if (bytes && dst != src)
      std::memmove(dst, src, bytes);
  }
  void fill(void *dst, uint8_t byte, size_t bytes) override {
    std::memset(dst, byte, bytes);
  }
  void insertBlock(const void *src, const std::vector<int64_t> &blockShape,
                   void *dst, const std::vector<int64_t> &dstShape,
                   const std::vector<int64_t> &offsets,
                   size_t elementBytes) override {
    runtime::insertBlock(static_cast<const uint8_t *>(src), blockShape,
                         static_cast<uint8_t *>(dst), dstShape, offsets,
                         elementBytes);
  }
  void extractBlock(const void *src, const std::vector<int64_t> &srcShape,
                    const std::vector<int64_t> &offsets, void *dst,
                    const std::vector<int64_t> &blockShape,
                    size_t elementBytes) override {
    runtime::extractBlock(static_cast<const uint8_t *>(src), srcShape, offsets,
                          static_cast<uint8_t *>(dst), blockShape,
                          elementBytes);
  }
  void reduceInOrder(const std::vector<const void *> &inputs,
                     const std::vector<void *> &outputs, size_t count,
                     DType type, ReduceOp op) override {
    runtime::reduceInOrder(inputs, outputs, count, type, op);
  }
  void convert(const void *src, DType from, void *dst, DType to,
               size_t n) override {
    const int64_t count = static_cast<int64_t>(n);
    (*findCpuKernel("ernie.cast"))({{const_cast<void *>(src), from, {count}}},
                                   {{dst, to, {count}}}, Attrs{});
  }

  const Kernel *kernelFor(const Instruction &inst,
                          std::shared_ptr<const Kernel> &) const override {
    // Program::load looked the CPU kernel up (and compiled fused bodies).
    return inst.kernel;
  }
  std::vector<std::string> kernelNames() const override {
    return cpuKernelNames();
  }
};

thread_local Stream threadStream;

} // namespace

Device &cpuDevice() {
  static CpuDevice device;
  return device;
}

bool cudaBackendBuilt() {
#ifdef ERNIE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cudaDeviceCount(std::string *reason) {
#ifdef ERNIE_HAVE_CUDA
  return countCudaDevices(reason);
#else
  if (reason)
    *reason = "built without CUDA (configure with -DERNIE_ENABLE_CUDA=ON "
              "where the CUDA toolkit is installed)";
  return 0;
#endif
}

std::shared_ptr<Device> openDevice(const std::string &spec) {
  if (spec == "cpu")
    return std::shared_ptr<Device>(&cpuDevice(), [](Device *) {});
  if (spec != "cuda" && spec.rfind("cuda:", 0) != 0)
    throw DeviceError("unknown device '" + spec +
                      "' (expected cpu, cuda or cuda:N)");
  int ordinal = -1;
  if (spec.size() > 5) {
    const std::string digits = spec.substr(5);
    if (digits.empty() || digits.size() > 4 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      throw DeviceError("unknown device '" + spec +
                        "' (expected cpu, cuda or cuda:N)");
    ordinal = std::stoi(digits);
  }
  std::string reason;
  int count = cudaDeviceCount(&reason);
  if (count == 0)
    throw DeviceError("--device " + spec + ": " + reason);
  if (ordinal < 0) {
    // Launchers that start one process per GPU (torchrun's convention) say
    // which one is this process's.
    const char *local = std::getenv("LOCAL_RANK");
    ordinal = local ? std::atoi(local) % count : 0;
  }
  if (ordinal >= count)
    throw DeviceError("--device " + spec + ": only " + std::to_string(count) +
                      " CUDA device(s) visible");
#ifdef ERNIE_HAVE_CUDA
  return openCudaDevice(ordinal);
#else
  throw DeviceError("built without CUDA");
#endif
}

Stream currentStream() { return threadStream; }

StreamGuard::StreamGuard(Stream stream) : previous_(threadStream) {
  threadStream = stream;
}

StreamGuard::~StreamGuard() { threadStream = previous_; }

//===----------------------------------------------------------------------===//
// Buffers and tensors
//===----------------------------------------------------------------------===//

DeviceBuffer::DeviceBuffer(Device &device, size_t bytes)
    : device_(&device), data_(device.allocate(bytes)), size_(bytes) {}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    data_ = other.data_;
    size_ = other.size_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void DeviceBuffer::reserve(Device &device, size_t bytes) {
  if (device_ == &device && size_ >= bytes)
    return;
  reset();
  *this = DeviceBuffer(device, bytes);
}

void DeviceBuffer::reset() {
  if (data_)
    device_->deallocate(data_);
  device_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

DeviceTensor::DeviceTensor(Device &device, DType type,
                           std::vector<int64_t> shape)
    : type(type), shape(std::move(shape)) {
  buffer = DeviceBuffer(device, bytes());
}

DeviceTensor DeviceTensor::upload(Device &device, const HostTensor &host) {
  DeviceTensor t(device, host.type, host.shape);
  device.upload(t.buffer.data(), host.bytes.data(), host.bytes.size());
  return t;
}

HostTensor DeviceTensor::download() const {
  HostTensor host(type, shape);
  if (!empty())
    device().download(host.bytes.data(), buffer.data(), host.bytes.size());
  return host;
}

void DeviceTensor::assign(const HostTensor &host) {
  if (host.type != type || host.shape != shape)
    throw std::invalid_argument("a tensor of another type or shape");
  device().upload(buffer.data(), host.bytes.data(), host.bytes.size());
}

//===----------------------------------------------------------------------===//
// Host memory through any engine
//===----------------------------------------------------------------------===//

namespace {
/// Runs `body` on device copies of host buffers when `comm` carries device
/// memory: `in` (inBytes) is uploaded first, `out` (outBytes) downloaded
/// after; on the host the pointers pass through.
template <typename Fn>
void staged(Communicator &comm, const void *in, size_t inBytes, void *out,
            size_t outBytes, Fn body) {
  Device &device = comm.device();
  if (device.hostAddressable())
    return body(in, out);
  DeviceBuffer din(device, inBytes ? inBytes : 1),
      dout(device, outBytes ? outBytes : 1);
  if (inBytes)
    device.upload(din.data(), in, inBytes);
  body(inBytes ? din.data() : nullptr, outBytes ? dout.data() : nullptr);
  if (outBytes)
    device.download(out, dout.data(), outBytes);
}
} // namespace

void hostAllReduce(Communicator &comm, const void *in, void *out, size_t count,
                   DType type, ReduceOp op, const Axes &axes) {
  size_t bytes = count * byteSize(type);
  staged(comm, in, bytes, out, bytes, [&](const void *i, void *o) {
    comm.allReduce(i, o, count, type, op, axes);
  });
}

void hostAllGather(Communicator &comm, const void *in, void *out, size_t bytes,
                   const Axes &axes) {
  size_t members = comm.mesh().group(comm.rank(), axes).size();
  staged(comm, in, bytes, out, bytes * members, [&](const void *i, void *o) {
    comm.allGather(i, o, bytes, axes);
  });
}

void hostBroadcast(Communicator &comm, void *data, size_t bytes,
                   int64_t rootIndex, const Axes &axes) {
  if (comm.device().hostAddressable())
    return comm.broadcast(data, bytes, rootIndex, axes);
  Device &device = comm.device();
  DeviceBuffer d(device, bytes ? bytes : 1);
  device.upload(d.data(), data, bytes);
  comm.broadcast(d.data(), bytes, rootIndex, axes);
  device.download(data, d.data(), bytes);
}

void hostSend(Communicator &comm, const void *data, size_t bytes, int64_t peer,
              int64_t tag) {
  staged(comm, data, bytes, nullptr, 0, [&](const void *i, void *) {
    comm.send(i, bytes, peer, tag);
  });
}

void hostRecv(Communicator &comm, void *data, size_t bytes, int64_t peer,
              int64_t tag) {
  staged(comm, nullptr, 0, data, bytes, [&](const void *, void *o) {
    comm.recv(o, bytes, peer, tag);
  });
}

} // namespace ernie::runtime
