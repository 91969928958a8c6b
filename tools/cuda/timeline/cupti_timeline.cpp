// A kernel timeline of any CUDA program, graph replays included: the start and end of every
// kernel (and of each kernel node of a replayed graph) as the GPU ran it, from CUPTI's activity
// records (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which keeps kernels concurrent and programmatic
// dependent launches overlapping). Loaded by the driver as an injection library:
//   CUDA_INJECTION64_PATH=libqwenrt_timeline.so QWENRT_TIMELINE=out.csv qwenrt bench ...
// writes one CSV row a kernel at exit: start_ns,end_ns,stream,graph_id,graph_node_id,grid,block,
// registers,name (demangled). tools/cuda/timeline.py reads it. ncu times kernels one at a time
// outside the graph; this is where the time goes inside the replayed step.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  uint64_t start, end;
  uint32_t stream, graph_id;
  uint64_t graph_node_id;
  int grid, block, registers;
  std::string name;
};

std::mutex g_mutex;
std::vector<Record>* g_records = nullptr;  // never freed: atexit order with CUPTI's own exit
constexpr size_t kBufferBytes = 8u << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "qwenrt timeline: %s failed: %s\n", what, msg ? msg : "?");
}

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = (status == 0 && d) ? d : name;
  std::free(d);
  for (char& c : out)
    if (c == ',' || c == '\n') c = ';';  // one CSV field
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<Record> batch;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    batch.push_back({k->start, k->end, k->streamId, k->graphId, k->graphNodeId,
                     k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                     k->registersPerThread, demangle(k->name)});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& r : batch) g_records->push_back(std::move(r));
}

void write_out() {
  check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  const char* path = std::getenv("QWENRT_TIMELINE");
  if (!path || !*path) path = "timeline.csv";
  std::FILE* f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "qwenrt timeline: cannot write %s\n", path);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(f, "start_ns,end_ns,stream,graph_id,graph_node_id,grid,block,registers,name\n");
  for (const Record& r : *g_records)
    std::fprintf(f, "%llu,%llu,%u,%u,%llu,%d,%d,%d,%s\n", (unsigned long long)r.start,
                 (unsigned long long)r.end, r.stream, r.graph_id,
                 (unsigned long long)r.graph_node_id, r.grid, r.block, r.registers, r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "qwenrt timeline: %zu kernels -> %s\n", g_records->size(), path);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  g_records = new std::vector<Record>();
  g_records->reserve(1u << 20);
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
        "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
        "cuptiActivityEnable(CONCURRENT_KERNEL)");
  std::atexit(write_out);
  return 1;
}
