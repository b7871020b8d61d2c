// gemm_libraries.cpp — the candidate CPU GEMM libraries on ernie's shapes.
//
// OpenBLAS, BLIS and oneDNN each loaded with dlopen (RTLD_LOCAL: OpenBLAS
// and BLIS both export cblas_sgemm), timed on the f32 GEMMs of
// bench/runtime_step.py's training step (1024 tokens, hidden 256, q/o
// 256x256, k/v 256x128, MLP 256x704 and back, LM head 256x4096; forward,
// data gradient and weight gradient of each), one thread each.
//
//   g++ -O2 -std=c++17 bench/gemm_libraries.cpp -ldl -o /tmp/gemm_libraries
//   OPENBLAS_NUM_THREADS=1 BLIS_NUM_THREADS=1 OMP_NUM_THREADS=1 /tmp/gemm_libraries
//
// Not part of the build: the runtime links OpenBLAS; this says whether it
// should (bench/README.md has the table).

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

enum { RowMajor = 101, NoTrans = 111, Trans = 112 };
using Cblas = void (*)(int, int, int, int, int, int, float, const float *, int,
                       const float *, int, float, float *, int);
using Dnnl = int (*)(char, char, long, long, long, float, const float *, long,
                     const float *, long, float, float *, long);

struct Shape {
  const char *what;
  bool ta, tb;
  int m, n, k;
};

/// C[m, n] = op(A) op(B), row-major; `call` runs one product.
template <typename Call>
double gflops(const Shape &s, Call call) {
  std::vector<float> a(size_t(s.m) * s.k, 0.5f), b(size_t(s.k) * s.n, 0.25f),
      c(size_t(s.m) * s.n);
  call(s, a.data(), b.data(), c.data()); // warm-up (JIT, packing buffers)
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    int n = 0;
    auto start = std::chrono::steady_clock::now();
    double seconds = 0;
    do {
      call(s, a.data(), b.data(), c.data());
      ++n;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                              start)
                    .count();
    } while (seconds < 0.2);
    best = std::min(best, seconds / n);
  }
  return 2.0 * s.m * s.n * s.k / best / 1e9;
}

void *open(const char *lib) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h)
    std::fprintf(stderr, "skipping %s: %s\n", lib, dlerror());
  return h;
}

} // namespace

int main() {
  const int t = 1024;
  std::vector<Shape> shapes;
  auto linear = [&](const char *what, int in, int out) {
    shapes.push_back({what, false, false, t, out, in});  // y = x W
    shapes.push_back({what, false, true, t, in, out});   // dx = dy W^T
    shapes.push_back({what, true, false, in, out, t});   // dW = x^T dy
  };
  linear("q/o 256x256", 256, 256);
  linear("k/v 256x128", 256, 128);
  linear("gate/up 256x704", 256, 704);
  linear("down 704x256", 704, 256);
  linear("lm head 256x4096", 256, 4096);

  struct Library {
    std::string name;
    Cblas cblas = nullptr;
    Dnnl dnnl = nullptr;
  };
  std::vector<Library> libs;
  if (void *h = open("libopenblas.so.0"))
    libs.push_back({"OpenBLAS", (Cblas)dlsym(h, "cblas_sgemm")});
  if (void *h = open("libblis.so.4"))
    libs.push_back({"BLIS", (Cblas)dlsym(h, "cblas_sgemm")});
  if (void *h = open("libdnnl.so.2"))
    libs.push_back({"oneDNN", nullptr, (Dnnl)dlsym(h, "dnnl_sgemm")});

  std::printf("%-18s %-4s %16s", "GEMM (f32)", "op", "m x n x k");
  for (const Library &l : libs)
    std::printf(" %10s", l.name.c_str());
  std::printf("   (GFLOP/s, one thread, best of 5)\n");
  std::vector<double> total(libs.size());
  double work = 0;
  for (const Shape &s : shapes) {
    char dims[64];
    std::snprintf(dims, sizeof dims, "%dx%dx%d", s.m, s.n, s.k);
    std::printf("%-18s %-4s %16s", s.what,
                s.ta ? "AtB" : s.tb ? "ABt" : "AB", dims);
    double flop = 2.0 * s.m * s.n * s.k;
    work += flop;
    for (size_t i = 0; i < libs.size(); ++i) {
      const Library &l = libs[i];
      double g = gflops(s, [&](const Shape &s, const float *a, const float *b,
                               float *c) {
        int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
        if (l.cblas)
          l.cblas(RowMajor, s.ta ? Trans : NoTrans, s.tb ? Trans : NoTrans,
                  s.m, s.n, s.k, 1.f, a, lda, b, ldb, 0.f, c, s.n);
        else
          l.dnnl(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.f, a,
                 lda, b, ldb, 0.f, c, s.n);
      });
      total[i] += flop / (g * 1e9);
      std::printf(" %10.1f", g);
    }
    std::printf("\n");
  }
  std::printf("%-40s", "the step's 15 GEMMs, time-weighted");
  for (double seconds : total)
    std::printf(" %10.1f", work / seconds / 1e9);
  std::printf("\n");
}
