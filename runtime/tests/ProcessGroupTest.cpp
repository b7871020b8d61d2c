//===- ProcessGroupTest.cpp - a job's processes and their mixed groups -----===//
//
// Two "processes" of a job in this test process, each a ProcessGroup with
// two ranks: groups inside a process meet in the thread engine, the others
// over Gloo, and every collective computes what the definition says, with
// the bits of the thread engine over the whole mesh. The join names the
// process that never came, refused, or runs another job; a process that
// dies (a forked child) is named by stoppedProcesses.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/ProcessGroup.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include "CollectiveChecks.h"
#include "StoreHelpers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

using namespace ernie::runtime;
using namespace ernie::runtime::testing;
using ::testing::HasSubstr;

namespace {

ProcessGroupOptions jobOptions(int64_t process, const std::string &address,
                               int64_t ranksPerProcess = 2,
                               std::chrono::milliseconds timeout =
                                   std::chrono::seconds(30)) {
  ProcessGroupOptions o;
  o.process = process;
  o.processes = 2;
  o.ranksPerProcess = ranksPerProcess;
  o.storeAddress = address;
  o.timeout = timeout;
  o.heartbeat = std::chrono::milliseconds(100);
  return o;
}

/// Runs `body(comm)` on every rank of `mesh` as 2 processes x 2 ranks:
/// each process a ProcessGroup and a ThreadWorld of its own.
template <typename Fn> void onMixedRanks(const Mesh &mesh, Fn body) {
  std::string address = freeAddress();
  std::vector<std::unique_ptr<ProcessGroup>> groups(2);
  std::vector<std::unique_ptr<ThreadWorld>> worlds(2);
  onThreads(2, [&](int64_t p) {
    groups[p] = std::make_unique<ProcessGroup>(jobOptions(p, address));
    groups[p]->join("program=same");
    worlds[p] = std::make_unique<ThreadWorld>(mesh);
  });
  onThreads(4, [&](int64_t r) {
    int64_t p = r / 2;
    auto comm = groups[p]->communicator(mesh, r, worlds[p]->communicator(r));
    body(*comm);
  });
  onThreads(2, [&](int64_t p) { groups[p].reset(); });
}

TEST(MixedCommunicator, EveryCollectiveOnEveryAxisSubset) {
  Mesh mesh({"a", "b"}, {2, 2});
  onMixedRanks(mesh, [&](Communicator &comm) {
    for (const Axes &axes : axisSubsets(mesh)) {
      SCOPED_TRACE(::testing::Message() << "axes " << describeAxes(axes));
      checkEveryCollective(comm, mesh, axes);
      checkPermutes(comm, mesh, axes);
    }
  });
}

TEST(MixedCommunicator, PointToPointInsideAndAcrossProcesses) {
  Mesh mesh({"pp"}, {4});
  onMixedRanks(mesh, [&](Communicator &comm) {
    int64_t r = comm.rank();
    double x = 10.0 + r, y = 0;
    comm.send(&x, sizeof x, (r + 1) % 4, 7);
    comm.recv(&y, sizeof y, (r + 3) % 4, 7);
    EXPECT_EQ(y, 10.0 + (r + 3) % 4) << "rank " << r;
  });
}

// f32 sums whose order matters: a group that spans processes reduces in
// group order as the thread engine does for the whole mesh.
TEST(MixedCommunicator, SameBitsAsTheThreadEngine) {
  Mesh mesh({"dp", "mp"}, {2, 2});
  auto input = [](int64_t rank) {
    std::vector<float> in(257);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = std::sin(0.3f * rank + 0.11f * i) * 1e4f + 1e-3f * i;
    return in;
  };
  std::vector<std::vector<float>> threads(4), mixed(4);
  auto reduce = [&](Communicator &comm, std::vector<std::vector<float>> &out) {
    std::vector<float> in = input(comm.rank()), sum(in.size());
    for (const Axes &axes : {Axes{"dp"}, Axes{"mp"}, Axes{"dp", "mp"}}) {
      comm.allReduce(in.data(), sum.data(), in.size(), DType::F32,
                     ReduceOp::Sum, axes);
      out[comm.rank()].insert(out[comm.rank()].end(), sum.begin(), sum.end());
    }
  };
  ThreadWorld world(mesh);
  onThreads(4, [&](int64_t r) { reduce(*world.communicator(r), threads); });
  onMixedRanks(mesh, [&](Communicator &comm) { reduce(comm, mixed); });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(threads[r].size(), mixed[r].size());
    EXPECT_EQ(0, std::memcmp(threads[r].data(), mixed[r].data(),
                             mixed[r].size() * sizeof(float)))
        << "rank " << r;
  }
}

/// What join() throws on each of the two processes (empty: it returned).
std::vector<std::string> joinBoth(const std::string &first,
                                  const std::string &second,
                                  const std::string &refusal = "") {
  std::string address = freeAddress();
  std::vector<std::string> errors(2);
  onThreads(2, [&](int64_t p) {
    ProcessGroup group(jobOptions(p, address));
    try {
      group.join(p == 0 ? first : second, p == 1 ? refusal : "");
    } catch (const CommunicationError &e) {
      errors[p] = e.what();
    }
  });
  return errors;
}

TEST(ProcessGroup, AJobOfOneIdentityStarts) {
  EXPECT_EQ(joinBoth("program=a\nseed=1", "program=a\nseed=1"),
            (std::vector<std::string>{"", ""}));
}

TEST(ProcessGroup, EveryProcessNamesTheOneRunningAnotherJob) {
  for (const std::string &error : joinBoth("program=a\nseed=1", "program=a\nseed=2"))
    EXPECT_THAT(error, HasSubstr("process 1 (mesh ranks 2..3) runs a different "
                                 "job than process 0: seed=2 vs seed=1"));
}

TEST(ProcessGroup, EveryProcessNamesTheOneThatRefused) {
  for (const std::string &error : joinBoth("x", "x", "needs 9 GB, has 8"))
    EXPECT_THAT(error, HasSubstr("process 1 (mesh ranks 2..3) refused to "
                                 "start: needs 9 GB, has 8"));
}

TEST(ProcessGroup, AProcessThatNeverJoinsIsNamedWithinTheTimeout) {
  ProcessGroup group(jobOptions(0, freeAddress(), 1, std::chrono::milliseconds(500)));
  auto start = std::chrono::steady_clock::now();
  try {
    group.join("x");
    FAIL() << "joined alone";
  } catch (const CommunicationError &e) {
    EXPECT_THAT(e.what(), HasSubstr("process 1 (mesh rank 1) never did"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(ProcessGroup, AStorePortInUseIsNamed) {
  Listener taken; // holds a loopback port
  try {
    ProcessGroup group(jobOptions(0, taken.address()));
    FAIL() << "served a port in use";
  } catch (const CommunicationError &e) {
    EXPECT_THAT(e.what(), HasSubstr("process 0 (mesh ranks 0..1): the job's store at " +
                                    taken.address()));
    EXPECT_THAT(e.what(), HasSubstr("another job using the port"));
  }
}

// A forked child is process 1: it joins, beats and dies without a word
// (as SIGKILL leaves it); process 0 names it. A process that left on
// purpose (its group destroyed) is not named.
TEST(ProcessGroup, AProcessThatDiesIsNamedAndOneThatLeftIsNot) {
  for (bool dies : {true, false}) {
    std::string address = freeAddress();
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      {
        ProcessGroup group(jobOptions(1, address));
        group.join("x");
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        if (dies)
          _exit(0); // no destructor: the heartbeat just stops
      }
      _exit(0);
    }
    {
      ProcessGroup group(jobOptions(0, address));
      group.join("x");
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      std::string stopped = group.stoppedProcesses();
      if (dies)
        EXPECT_THAT(stopped, HasSubstr("process 1 (mesh ranks 2..3) has stopped: "
                                       "no heartbeat"));
      else
        EXPECT_EQ(stopped, "");
    }
    int status = 0;
    waitpid(child, &status, 0);
  }
}

} // namespace
