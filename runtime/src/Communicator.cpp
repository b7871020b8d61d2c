//===- Communicator.cpp - shared pieces of every collective engine ----------===//

#include "ernie/runtime/Communicator.h"
#include "ernie/runtime/FloatConvert.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>

namespace ernie::runtime {

void AsyncHandle::wait() {
  if (future_.valid())
    future_.get();
}

/// One thread per communicator running started collectives first in, first
/// out. (A thread per collective, as std::async gives, lets two started
/// collectives reach the engine in either order, and ranks that pair them
/// differently exchange the wrong buffers.)
struct Communicator::Worker {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<std::packaged_task<void()>> queue;
  bool stopping = false;
  std::thread thread;

  Worker() : thread([this] { run(); }) {}

  void run() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex);
        ready.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty())
          return;
        task = std::move(queue.front());
        queue.pop_front();
      }
      task(); // An exception is stored in the task's future.
    }
  }

  void finish() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    ready.notify_one();
    if (thread.joinable())
      thread.join();
  }
};

Communicator::Communicator() = default;

Communicator::~Communicator() { finishStarted(); }

void Communicator::finishStarted() {
  if (worker_)
    worker_->finish();
  worker_.reset();
}

AsyncHandle Communicator::start(std::function<void()> collective) {
  if (!worker_)
    worker_ = std::make_unique<Worker>();
  std::packaged_task<void()> task(std::move(collective));
  std::future<void> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(worker_->mutex);
    worker_->queue.push_back(std::move(task));
  }
  worker_->ready.notify_one();
  return AsyncHandle(std::move(done));
}

namespace {
/// dst[i] = dst[i] (op) src[i], with the op chosen outside the loop so each
/// loop vectorises.
template <typename T>
void reduceTyped(T *dst, const T *src, size_t count, ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
  case ReduceOp::Avg: // Divided once all terms are in (see reduceInOrder).
    for (size_t i = 0; i < count; ++i)
      dst[i] = dst[i] + src[i];
    return;
  case ReduceOp::Max:
    for (size_t i = 0; i < count; ++i)
      dst[i] = maximumOf(dst[i], src[i]);
    return;
  case ReduceOp::Min:
    for (size_t i = 0; i < count; ++i)
      dst[i] = minimumOf(dst[i], src[i]);
    return;
  }
}

/// d0[i] = f(a[i], b[i]), and d1[i] too when given (an all-reduce's two
/// outputs in one pass). A destination may be a or b: each element is read
/// before it is written.
template <typename T, typename F>
void combineWith(T *d0, T *d1, const T *a, const T *b, size_t count, F f) {
  if (d1) {
    for (size_t i = 0; i < count; ++i) {
      T v = f(a[i], b[i]);
      d0[i] = v;
      d1[i] = v;
    }
  } else {
    for (size_t i = 0; i < count; ++i)
      d0[i] = f(a[i], b[i]);
  }
}

/// d = a (op) b elementwise, divided by `terms` for Avg.
template <typename T>
void combineTyped(T *d0, T *d1, const T *a, const T *b, size_t count,
                  ReduceOp op, size_t terms) {
  switch (op) {
  case ReduceOp::Sum:
    return combineWith(d0, d1, a, b, count, [](T x, T y) { return x + y; });
  case ReduceOp::Avg:
    if constexpr (std::is_floating_point_v<T>) {
      const T n = static_cast<T>(terms);
      return combineWith(d0, d1, a, b, count,
                         [n](T x, T y) { return (x + y) / n; });
    } else {
      throw CommunicationError("avg reductions need a float type");
    }
  case ReduceOp::Max:
    return combineWith(d0, d1, a, b, count,
                       [](T x, T y) { return maximumOf(x, y); });
  case ReduceOp::Min:
    return combineWith(d0, d1, a, b, count,
                       [](T x, T y) { return minimumOf(x, y); });
  }
}

/// Elements per step of a blocked reduction: the accumulator (and, for
/// narrow types, one widened input) stay in L1.
constexpr size_t kReduceBlock = 1024;

/// The ordered reduction ((in0 op in1) op in2)... of T (a type reduced as
/// itself), a block at a time, written to every output. The last term is
/// combined straight into the first two outputs (one read of each input
/// and one write of each output, as fast as a memcpy), further outputs
/// copied from the first's hot block;
/// more than two inputs go through a stack accumulator first. An output may
/// be one of the inputs: each block of every input is read before that
/// block of any output is written.
template <typename T>
void reduceInOrderTyped(const std::vector<const void *> &inputs,
                        const std::vector<void *> &outputs, size_t count,
                        ReduceOp op) {
  const size_t n = inputs.size();
  auto in = [&](size_t k, size_t start) {
    return static_cast<const T *>(inputs[k]) + start;
  };
  T acc[kReduceBlock];
  for (size_t start = 0; start < count; start += kReduceBlock) {
    const size_t m = std::min(kReduceBlock, count - start);
    T *first = static_cast<T *>(outputs[0]) + start;
    const T *partial = in(0, start);
    if (n > 2) {
      std::memcpy(acc, partial, m * sizeof(T));
      for (size_t k = 1; k + 1 < n; ++k)
        reduceTyped(acc, in(k, start), m, op);
      partial = acc;
    }
    if (n == 1) {
      if (op == ReduceOp::Avg && !std::is_floating_point_v<T>)
        throw CommunicationError("avg reductions need a float type");
      std::memmove(first, partial, m * sizeof(T));
    } else {
      T *second = outputs.size() > 1 ? static_cast<T *>(outputs[1]) + start
                                     : nullptr;
      combineTyped(first, second, partial, in(n - 1, start), m, op, n);
    }
    for (size_t k = n == 1 ? 1 : 2; k < outputs.size(); ++k)
      std::memcpy(static_cast<T *>(outputs[k]) + start, first, m * sizeof(T));
  }
}

/// bf16/f16/fp8 accumulate in f32 and round once at the end, so the sum of
/// n terms is as accurate as the f32 one and still has one order.
void reduceInOrderNarrow(const std::vector<const void *> &inputs,
                         const std::vector<void *> &outputs, size_t count,
                         DType type, ReduceOp op) {
  const size_t elem = byteSize(type);
  float acc[kReduceBlock], term[kReduceBlock];
  for (size_t start = 0; start < count; start += kReduceBlock) {
    size_t m = std::min(kReduceBlock, count - start);
    auto at = [&](const void *p) {
      return static_cast<const char *>(p) + start * elem;
    };
    narrowToFloat(type, at(inputs[0]), acc, m);
    for (size_t k = 1; k < inputs.size(); ++k) {
      narrowToFloat(type, at(inputs[k]), term, m);
      reduceTyped(acc, term, m, op);
    }
    if (op == ReduceOp::Avg) {
      const float n = static_cast<float>(inputs.size());
      for (size_t i = 0; i < m; ++i)
        acc[i] /= n;
    }
    floatToNarrow(type, acc, static_cast<char *>(outputs[0]) + start * elem, m);
    for (size_t k = 1; k < outputs.size(); ++k)
      std::memcpy(static_cast<char *>(outputs[k]) + start * elem,
                  static_cast<char *>(outputs[0]) + start * elem, m * elem);
  }
}
} // namespace

void reduceInto(void *dst, const void *src, size_t count, DType type,
                ReduceOp op) {
  // dst's own block is read before it is written: reduceInOrder of (dst,
  // src) into dst is this, with Avg's division left to the caller.
  reduceInOrder({dst, src}, dst, count, type,
                op == ReduceOp::Avg ? ReduceOp::Sum : op);
}

void reduceInOrder(const std::vector<const void *> &inputs, void *out,
                   size_t count, DType type, ReduceOp op) {
  reduceInOrder(inputs, std::vector<void *>{out}, count, type, op);
}

void reduceInOrder(const std::vector<const void *> &inputs,
                   const std::vector<void *> &outputs, size_t count, DType type,
                   ReduceOp op) {
  switch (type) {
  case DType::F64:
    return reduceInOrderTyped<double>(inputs, outputs, count, op);
  case DType::F32:
    return reduceInOrderTyped<float>(inputs, outputs, count, op);
  case DType::I64:
    return reduceInOrderTyped<int64_t>(inputs, outputs, count, op);
  case DType::I32:
    return reduceInOrderTyped<int32_t>(inputs, outputs, count, op);
  default:
    if (isNarrowFloat(type))
      return reduceInOrderNarrow(inputs, outputs, count, type, op);
    throw CommunicationError(std::string("reductions of ") +
                             std::string(name(type)) + " are not supported");
  }
}

int64_t shiftedIndex(int64_t index, int64_t shift, int64_t n) {
  int64_t k = (index + shift % n) % n; // |index + shift % n| < 2n: no overflow
  return k < 0 ? k + n : k;
}

std::string describeAxes(const Axes &axes) {
  std::string s = "[";
  for (size_t i = 0; i < axes.size(); ++i)
    s += (i ? ", " : "") + axes[i];
  return s + "]";
}

} // namespace ernie::runtime
