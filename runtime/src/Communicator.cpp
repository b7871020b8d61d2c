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
template <typename T>
void reduceTyped(T *dst, const T *src, size_t count, ReduceOp op) {
  for (size_t i = 0; i < count; ++i) {
    switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: // Divided once all terms are in (see the engines).
      dst[i] = dst[i] + src[i];
      break;
    case ReduceOp::Max:
      dst[i] = maximumOf(dst[i], src[i]);
      break;
    case ReduceOp::Min:
      dst[i] = minimumOf(dst[i], src[i]);
      break;
    }
  }
}
} // namespace

void reduceInto(void *dst, const void *src, size_t count, DType type,
                ReduceOp op) {
  switch (type) {
  case DType::F64:
    return reduceTyped(static_cast<double *>(dst),
                       static_cast<const double *>(src), count, op);
  case DType::F32:
    return reduceTyped(static_cast<float *>(dst),
                       static_cast<const float *>(src), count, op);
  case DType::I64:
    return reduceTyped(static_cast<int64_t *>(dst),
                       static_cast<const int64_t *>(src), count, op);
  case DType::I32:
    return reduceTyped(static_cast<int32_t *>(dst),
                       static_cast<const int32_t *>(src), count, op);
  default:
    if (isNarrowFloat(type)) {
      // Computed in f32 and rounded once per reduction step.
      std::vector<float> a(count), b(count);
      narrowToFloat(type, dst, a.data(), count);
      narrowToFloat(type, src, b.data(), count);
      reduceTyped(a.data(), b.data(), count, op);
      floatToNarrow(type, a.data(), dst, count);
      return;
    }
    throw CommunicationError(std::string("reductions of ") +
                             std::string(name(type)) + " are not supported");
  }
}

void reduceInOrder(const std::vector<const void *> &inputs, void *out,
                   size_t count, DType type, ReduceOp op) {
  if (isNarrowFloat(type)) {
    // bf16/f16/fp8 accumulate in f32 and round once at the end, so the sum
    // of n terms is as accurate as the f32 one and still has one order.
    std::vector<std::vector<float>> wide(inputs.size(), std::vector<float>(count));
    std::vector<const void *> views;
    for (size_t i = 0; i < inputs.size(); ++i) {
      narrowToFloat(type, inputs[i], wide[i].data(), count);
      views.push_back(wide[i].data());
    }
    std::vector<float> acc(count);
    reduceInOrder(views, acc.data(), count, DType::F32, op);
    floatToNarrow(type, acc.data(), out, count);
    return;
  }
  size_t bytes = count * byteSize(type);
  std::vector<char> acc(static_cast<const char *>(inputs[0]),
                        static_cast<const char *>(inputs[0]) + bytes);
  for (size_t i = 1; i < inputs.size(); ++i)
    reduceInto(acc.data(), inputs[i], count, type, op);
  if (op == ReduceOp::Avg) {
    double n = static_cast<double>(inputs.size());
    if (type == DType::F64) {
      for (size_t i = 0; i < count; ++i)
        reinterpret_cast<double *>(acc.data())[i] /= n;
    } else if (type == DType::F32) {
      for (size_t i = 0; i < count; ++i)
        reinterpret_cast<float *>(acc.data())[i] /= static_cast<float>(n);
    } else {
      throw CommunicationError("avg reductions need a float type");
    }
  }
  std::memcpy(out, acc.data(), bytes);
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
