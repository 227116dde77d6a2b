// Contract tests of the CPU communicator (parallel/cpu_communicator.h): every collective on random
// data of 1, 7 and 4096 elements at world sizes 1, 2, 3, 4 and 8 equals a serial reference bitwise
// (the backend sums in rank order, so the reference does too), on every rank, over repeated calls;
// a failing rank aborts the others instead of leaving them waiting.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/cpu_communicator.h"
#include "parallel/tp_backend.h"
#include "test_util.h"

namespace moefold {
namespace {

/// Runs fn(comm) on one thread per rank; rethrows the first rank's exception.
void run_ranks(CpuCommGroup& g, const std::function<void(Communicator&)>& fn) {
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errs(static_cast<size_t>(g.world_size()));
  for (int r = 0; r < g.world_size(); ++r)
    ts.emplace_back([&, r] {
      try {
        fn(g.comm(r));
      } catch (...) {
        errs[size_t(r)] = std::current_exception();
        g.abort("rank " + std::to_string(r) + " failed");
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

std::vector<float> data_of(int rank, int64_t n, uint64_t salt) { return test::randn(size_t(n), 1000 * salt + rank); }

struct Case {
  int world;
  int64_t n;
};
class CommContract : public ::testing::TestWithParam<Case> {};

TEST_P(CommContract, AllReduceSumEqualsRankOrderSumOnEveryRank) {
  const int N = GetParam().world;
  const int64_t n = GetParam().n;
  CpuCommGroup g(N);
  for (uint64_t call = 0; call < 3; ++call) {  // repeated calls reuse the group's scratch
    std::vector<std::vector<float>> bufs(static_cast<size_t>(N));
    for (int r = 0; r < N; ++r) bufs[size_t(r)] = data_of(r, n, call);
    std::vector<float> ref = bufs[0];
    for (int r = 1; r < N; ++r)
      for (int64_t i = 0; i < n; ++i) ref[size_t(i)] += bufs[size_t(r)][size_t(i)];
    run_ranks(g, [&](Communicator& c) {
      // Different arrival orders per call: the result must not depend on them.
      std::this_thread::sleep_for(std::chrono::microseconds(((c.rank() * 7 + int(call) * 3) % 4) * 200));
      c.all_reduce_sum(bufs[size_t(c.rank())].data(), n);
    });
    for (int r = 0; r < N; ++r) EXPECT_EQ(bufs[size_t(r)], ref) << "rank " << r << " call " << call;
  }
}

TEST_P(CommContract, AllGatherConcatenatesInRankOrder) {
  const int N = GetParam().world;
  const int64_t n = GetParam().n;
  CpuCommGroup g(N);
  std::vector<float> ref;
  for (int r = 0; r < N; ++r) {
    auto d = data_of(r, n, 7);
    ref.insert(ref.end(), d.begin(), d.end());
  }
  std::vector<std::vector<float>> out(static_cast<size_t>(N), test::poisoned(size_t(N * n)));
  run_ranks(g, [&](Communicator& c) {
    auto in = data_of(c.rank(), n, 7);
    c.all_gather(in.data(), out[size_t(c.rank())].data(), n);
  });
  for (int r = 0; r < N; ++r) EXPECT_EQ(out[size_t(r)], ref) << "rank " << r;
}

TEST_P(CommContract, ReduceScatterSumsEachRanksShareInRankOrder) {
  const int N = GetParam().world;
  const int64_t n = GetParam().n;
  CpuCommGroup g(N);
  std::vector<std::vector<float>> out(static_cast<size_t>(N), test::poisoned(size_t(n)));
  run_ranks(g, [&](Communicator& c) {
    auto in = data_of(c.rank(), N * n, 11);
    c.reduce_scatter_sum(in.data(), out[size_t(c.rank())].data(), n);
  });
  std::vector<std::vector<float>> in;
  for (int r = 0; r < N; ++r) in.push_back(data_of(r, N * n, 11));
  for (int r = 0; r < N; ++r) {
    std::vector<float> ref(in[0].begin() + r * n, in[0].begin() + (r + 1) * n);
    for (int j = 1; j < N; ++j)
      for (int64_t i = 0; i < n; ++i) ref[size_t(i)] += in[size_t(j)][size_t(r * n + i)];
    EXPECT_EQ(out[size_t(r)], ref) << "rank " << r;
  }
}

// Rank s sends (s + d + 1) * n / 2 elements to rank d (different sizes per pair, some empty when n
// is 1), packed in rank order; the receiver packs them in rank order too.
TEST_P(CommContract, AllToAllVDeliversEveryBlock) {
  const int N = GetParam().world;
  const int64_t n = GetParam().n;
  auto count = [&](int s, int d) { return int64_t(s + d + 1) * n / 2; };
  CpuCommGroup g(N);
  std::vector<std::vector<float>> recv(static_cast<size_t>(N));
  run_ranks(g, [&](Communicator& c) {
    const int me = c.rank();
    std::vector<int64_t> sc(static_cast<size_t>(N)), so(static_cast<size_t>(N)), rc(static_cast<size_t>(N)), ro(static_cast<size_t>(N));
    int64_t st = 0, rt = 0;
    for (int r = 0; r < N; ++r) {
      sc[size_t(r)] = count(me, r), so[size_t(r)] = st, st += sc[size_t(r)];
      rc[size_t(r)] = count(r, me), ro[size_t(r)] = rt, rt += rc[size_t(r)];
    }
    auto send = data_of(me, st, 13);
    recv[size_t(me)] = test::poisoned(size_t(rt));
    c.all_to_all_v(send.data(), sc, so, recv[size_t(me)].data(), rc, ro);
  });
  for (int d = 0; d < N; ++d) {
    std::vector<float> ref;
    for (int s = 0; s < N; ++s) {
      int64_t total = 0, off = 0;
      for (int r = 0; r < N; ++r) {
        if (r == d) off = total;
        total += count(s, r);
      }
      auto send = data_of(s, total, 13);
      ref.insert(ref.end(), send.begin() + off, send.begin() + off + count(s, d));
    }
    EXPECT_EQ(recv[size_t(d)], ref) << "rank " << d;
  }
}

TEST_P(CommContract, BarrierOrdersWritesBeforeReads) {
  const int N = GetParam().world;
  const int64_t n = GetParam().n;
  CpuCommGroup g(N);
  std::vector<int64_t> written(static_cast<size_t>(N), -1);
  std::atomic<int> wrong{0};
  run_ranks(g, [&](Communicator& c) {
    for (int64_t round = 0; round < 5; ++round) {
      written[size_t(c.rank())] = round * n;
      c.barrier();
      for (int r = 0; r < N; ++r)
        if (written[size_t(r)] != round * n) ++wrong;
      c.barrier();
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int w : {1, 2, 3, 4, 8})
    for (int64_t n : {1, 7, 4096}) out.push_back({w, n});
  return out;
}
INSTANTIATE_TEST_SUITE_P(Sizes, CommContract, ::testing::ValuesIn(cases()), [](const auto& info) {
  return "world" + std::to_string(info.param.world) + "_n" + std::to_string(info.param.n);
});

TEST(CpuCommunicator, FailingRankAbortsTheOthersWithAnError) {
  CpuCommGroup g(4);
  std::vector<float> buf(16, 1.0f);
  EXPECT_THROW(run_ranks(g,
                         [&](Communicator& c) {
                           std::vector<float> b(16, 1.0f);
                           if (c.rank() == 2) fail("rank 2 broke before its collective");
                           c.all_reduce_sum(b.data(), 16);
                         }),
               Error);
  g.reset();  // usable again afterwards
  std::vector<std::vector<float>> bufs(4, std::vector<float>(16, 1.0f));
  run_ranks(g, [&](Communicator& c) { c.all_reduce_sum(bufs[size_t(c.rank())].data(), 16); });
  EXPECT_EQ(bufs[3], std::vector<float>(16, 4.0f));
}

TEST(CpuCommunicator, MismatchedAllToAllCountsThrow) {
  CpuCommGroup g(2);
  EXPECT_THROW(run_ranks(g,
                         [&](Communicator& c) {
                           std::vector<float> s(4, 1.0f), r(4);
                           const std::vector<int64_t> sc{2, 2}, so{0, 2}, ro{0, 2};
                           const std::vector<int64_t> rc{2, c.rank() == 0 ? int64_t(1) : int64_t(2)};
                           c.all_to_all_v(s.data(), sc, so, r.data(), rc, ro);
                         }),
               Error);
}

TEST(CpuCommunicator, RejectsBadWorldSizeAndRank) {
  EXPECT_THROW(CpuCommGroup(0), Error);
  CpuCommGroup g(2);
  EXPECT_THROW(g.comm(2), Error);
  EXPECT_EQ(g.comm(1).rank(), 1);
  EXPECT_EQ(g.comm(1).world_size(), 2);
  EXPECT_EQ(g.comm(0).backend(), "cpu");
}

TEST(CpuCommunicator, SetStreamIsIgnored) {
  CpuCommGroup g(1);
  g.comm(0).set_stream(reinterpret_cast<void*>(0x10));  // no stream on the CPU: nothing to order with
  float x = 3.0f;
  g.comm(0).all_reduce_sum(&x, 1);
  EXPECT_EQ(x, 3.0f);
}

// The CUDA tensor-parallel backend: NCCL with one GPU per rank, the single-device test communicator
// only when MOEFOLD_TP_SINGLE_DEVICE=1 says so, never silently.
TEST(TpBackend, NcclWhenEnoughGpusSingleDeviceOnlyWhenAsked) {
  EXPECT_EQ(choose_tp_backend(2, 2, nullptr), TpCommBackend::Nccl);
  EXPECT_EQ(choose_tp_backend(4, 8, "0"), TpCommBackend::Nccl);
  EXPECT_EQ(choose_tp_backend(2, 1, "1"), TpCommBackend::SingleDevice);
  EXPECT_EQ(choose_tp_backend(2, 8, "1"), TpCommBackend::SingleDevice);  // explicit: also with enough GPUs
  EXPECT_EQ(to_string(TpCommBackend::SingleDevice), "single-device");
}

TEST(TpBackend, TooFewGpusOrABadValueFailWithTheCountsAndTheVariable) {
  auto message = [](int ranks, int gpus, const char* env) {
    try {
      choose_tp_backend(ranks, gpus, env);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string few = message(4, 1, nullptr);
  EXPECT_NE(few.find("needs 4 GPUs"), std::string::npos) << few;
  EXPECT_NE(few.find("1 visible"), std::string::npos) << few;
  EXPECT_NE(few.find("MOEFOLD_TP_SINGLE_DEVICE=1"), std::string::npos) << few;
  EXPECT_NE(message(2, 1, "0").find("needs 2 GPUs"), std::string::npos);
  EXPECT_NE(message(2, 1, "yes").find("expected 0 or 1"), std::string::npos);
  EXPECT_NE(message(1, 1, nullptr).find("at least 2"), std::string::npos);
}

}  // namespace
}  // namespace moefold
