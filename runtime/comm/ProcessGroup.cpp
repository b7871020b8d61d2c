//===- ProcessGroup.cpp - the processes of one multi-process job ------------===//

#include "ernie/runtime/ProcessGroup.h"

#include "comm/gloo/RendezvousStore.h"
#include "comm/nccl/NcclRendezvous.h"

#include <cstring>
#include <map>
#include <sstream>

namespace ernie::runtime {

namespace {

constexpr const char *kJoinKey = "ernie.job.join.";
constexpr const char *kHeartbeatKey = "ernie.job.heartbeat.";
/// A heartbeat's last value when its process let go of the job on purpose
/// (an error it reported, or the end): not a death to report.
constexpr const char *kLeft = "left";
/// A joining process's identity when it cannot run its part: then its reason.
constexpr const char *kRefused = "refused: ";

std::vector<char> bytesOf(const std::string &text) {
  return {text.begin(), text.end()};
}

std::vector<std::string> linesOf(const std::string &text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

/// The first line where `a` and `b` differ, as "a's vs b's".
std::string firstDifference(const std::string &a, const std::string &b) {
  std::vector<std::string> x = linesOf(a), y = linesOf(b);
  for (size_t i = 0; i < std::max(x.size(), y.size()); ++i) {
    std::string l = i < x.size() ? x[i] : "(nothing)";
    std::string r = i < y.size() ? y[i] : "(nothing)";
    if (l != r)
      return l + " vs " + r;
  }
  return "(identical)";
}

} // namespace

ProcessGroup::ProcessGroup(ProcessGroupOptions options)
    : options_(std::move(options)) {
  if (options_.processes < 1 || options_.process < 0 ||
      options_.process >= options_.processes)
    throw std::invalid_argument("process " + std::to_string(options_.process) +
                                " is not one of a job's " +
                                std::to_string(options_.processes));
  if (options_.ranksPerProcess < 1)
    throw std::invalid_argument("a process runs at least one rank");
  if (options_.storeAddress.empty())
    throw std::invalid_argument(
        "a multi-process job needs its store's address (process 0's "
        "host:port, MASTER_ADDR:MASTER_PORT)");
  try {
    store_ = std::make_shared<RendezvousStore>(
        options_.process, "", options_.storeAddress, options_.timeout);
  } catch (const CommunicationError &e) {
    std::string what = e.what();
    throw CommunicationError(
        describe(options_.process) + ": the job's store at " +
        options_.storeAddress + ": " + what.substr(what.find(": ") + 2) +
        (options_.process == 0
             ? " (process 0 serves it there: is another job using the port?)"
             : " (process 0 serves it: did it start, and is MASTER_ADDR its "
               "address?)"));
  }
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (heartbeat_.joinable()) {
    heartbeat_.join();
    try {
      store_->store().set(heartbeatKey(options_.process), bytesOf(kLeft));
    } catch (const std::exception &) {
      // The store may be gone already: nobody is left to ask.
    }
  }
}

std::string ProcessGroup::describe(int64_t process) const {
  int64_t first = process * options_.ranksPerProcess;
  int64_t last = first + options_.ranksPerProcess - 1;
  return "process " + std::to_string(process) +
         (first == last ? " (mesh rank " + std::to_string(first) + ")"
                        : " (mesh ranks " + std::to_string(first) + ".." +
                              std::to_string(last) + ")");
}

std::string ProcessGroup::heartbeatKey(int64_t process) const {
  return kHeartbeatKey + std::to_string(process);
}

void ProcessGroup::join(const std::string &identity,
                        const std::string &refusal) {
  gloo::rendezvous::Store &store = store_->store();
  auto key = [](int64_t p) { return kJoinKey + std::to_string(p); };
  std::vector<std::string> keys;
  for (int64_t p = 0; p < options_.processes; ++p)
    keys.push_back(key(p));
  try {
    store.set(key(options_.process),
              bytesOf(refusal.empty() ? identity : kRefused + refusal));
    store.wait(keys, options_.timeout);
  } catch (const std::exception &e) {
    std::string missing;
    for (int64_t p = 0; p < options_.processes; ++p) {
      try {
        store.wait({key(p)}, std::chrono::milliseconds(50));
      } catch (const std::exception &) {
        missing += (missing.empty() ? "" : ", ") + describe(p);
      }
    }
    if (!missing.empty())
      throw CommunicationError(
          describe(options_.process) + ": the job's " +
          std::to_string(options_.processes) + " processes did not all join "
          "within " + std::to_string(options_.timeout.count() / 1000.0) +
          " s: " + missing + " never did (a host that never started, a "
          "WORLD_SIZE or --nnodes too large, or a MASTER_ADDR:MASTER_PORT "
          "that is not process 0's) [" + e.what() + "]");
  }
  std::vector<std::string> identities;
  for (const std::string &k : keys) {
    std::vector<char> value = store.get(k);
    identities.emplace_back(value.begin(), value.end());
  }
  for (int64_t p = 0; p < options_.processes; ++p)
    if (identities[p].rfind(kRefused, 0) == 0)
      throw CommunicationError(describe(p) + " refused to start: " +
                               identities[p].substr(std::strlen(kRefused)));
  for (int64_t p = 1; p < options_.processes; ++p)
    if (identities[p] != identities[0])
      throw CommunicationError(
          describe(p) + " runs a different job than process 0: " +
          firstDifference(identities[p], identities[0]) +
          " (a script that branches on the rank before compiling, another "
          "checkout or data on one host, or a different launch command)");
  heartbeat_ = std::thread([this] { beat(); });
}

void ProcessGroup::beat() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (int64_t count = 1; !stopping_; ++count) {
    lock.unlock();
    try {
      store_->store().set(heartbeatKey(options_.process),
                          bytesOf(std::to_string(count)));
    } catch (const std::exception &) {
      // The store is gone (process 0 ended): stoppedProcesses says so.
    }
    lock.lock();
    stop_.wait_for(lock, options_.heartbeat, [&] { return stopping_; });
  }
}

std::string ProcessGroup::stoppedProcesses() {
  gloo::rendezvous::Store &store = store_->store();
  // Each process's counter, "" where none was set yet. Throws when the
  // store itself does not answer.
  auto sample = [&] {
    store.set("ernie.job.probe." + std::to_string(options_.process),
              bytesOf("1"));
    std::map<int64_t, std::string> values;
    for (int64_t p = 0; p < options_.processes; ++p) {
      if (p == options_.process)
        continue;
      try {
        store.wait({heartbeatKey(p)}, std::chrono::milliseconds(50));
      } catch (const std::exception &) {
        values[p] = "";
        continue;
      }
      std::vector<char> v = store.get(heartbeatKey(p));
      values[p] = std::string(v.begin(), v.end());
    }
    return values;
  };
  std::map<int64_t, std::string> before, after;
  const auto wait = 3 * options_.heartbeat;
  try {
    before = sample();
    std::this_thread::sleep_for(wait);
    after = sample();
  } catch (const std::exception &e) {
    if (options_.process == 0)
      return "";
    return describe(0) + " has stopped: the job's store it serves at " +
           options_.storeAddress + " no longer answers (" + e.what() + ")";
  }
  std::string stopped;
  for (const auto &[p, value] : after)
    if (value == before[p] && value != kLeft)
      stopped += (stopped.empty() ? "" : ", ") + describe(p);
  if (stopped.empty())
    return "";
  return stopped + (stopped.find(", ") == std::string::npos ? " has" : " have") +
         " stopped: no heartbeat for " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(wait).count()) +
         " s (killed, crashed or frozen)";
}

void ProcessGroup::abort(const std::string &reason) {
  store_->publishAbort(describe(options_.process) + ": " + reason);
}

std::unique_ptr<Communicator>
ProcessGroup::communicator(const Mesh &mesh, int64_t rank,
                           std::unique_ptr<Communicator> local) {
  const int64_t first = options_.process * options_.ranksPerProcess;
  if (rank < first || rank >= first + options_.ranksPerProcess)
    throw std::invalid_argument("rank " + std::to_string(rank) +
                                " is not one of " + describe(options_.process));
  GlooOptions gloo;
  gloo.hostname = options_.hostname;
  gloo.timeout = options_.timeout;
  return createMixedCommunicator(
      std::move(local), createGlooCommunicator(mesh, rank, store_, gloo),
      first, options_.ranksPerProcess);
}

std::unique_ptr<Communicator>
ProcessGroup::ncclCommunicator(const Mesh &mesh, int64_t rank,
                               NcclOptions options) {
  if (options_.ranksPerProcess != 1)
    throw std::invalid_argument(
        "NCCL runs one rank per process (one GPU each): launch one process "
        "per GPU (--nproc-per-node = GPUs per host)");
  options.timeout = options_.timeout;
  return createNcclCommunicator(mesh, rank, store_, std::move(options));
}

} // namespace ernie::runtime
