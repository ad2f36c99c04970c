// llama.cpp's vision encoder alone, timed: the llama.cpp peer of `cargo xtask bench` (issue 22).
//
// Links the pinned llama.cpp's clip library (tools/mtmd/clip.cpp and its model graphs, built by
// xtask/bench/llama/CMakeLists.txt against ggml; libllama and libmtmd are not built). It uses the
// clip API, the layer under mtmd that mtmd_encode calls: clip_init loads the mmproj GGUF, and
// clip_image_batch_encode runs one batch (graph build, allocation, input upload, the encoder and
// projector, rows back to the host) — what mtmd_encode does for an image's entries.
//
// Input: a VTIMG file (written by llama_peer.py) holding n images as f32 or u8, HWC, RGB.
//   f32: the preprocessed pixels the other sides use, handed to clip as clip_image_f32 as they are
//        (llama.cpp's own resize and normalisation skipped; the graph's own input scaling, e.g.
//        gemma4v's 2x-1, still runs).
//   u8:  a decoded image; llama.cpp's own preprocessing for the projector (mtmd-image.cpp:
//        gemma4v/glm4v dyn_size, glm5v its own) makes the clip_image_f32.
// Batching: where clip_support_batch() (gemma4v), all n images in one clip_image_batch_encode, as
// mtmd does; otherwise one clip_image_encode per image in a loop (stated in the JSON: "batched").
// Timing: steady_clock around the whole call (it returns only when the rows are on the host, so it
// is synchronised), --warmup untimed calls first, then --iters timed ones; median = sorted[n/2] as
// the other sides take it. Separately, "transfer_ms": the same-sized host->device upload of the
// pixels and device->host download of the rows through ggml-backend on the same device, which the
// clip call includes and the other sides' timings (device-resident inputs and rows) do not.
//
// Output: one JSON line on stdout (last line); the rows of every image in order as raw
// little-endian f32 [rows, width] in --out.
//
// usage: llama_clip_bench --mmproj F.gguf --input F.vtimg [--out rows.f32] [--iters 20]
//                         [--warmup 3] [--cpu] [--threads N] [--flash-attn auto|on|off]
//                         [--min-tokens N] [--max-tokens N]   (u8 input: llama.cpp's token budget)
//                         [--dump-pixels F.f32]   (the entries clip gets, raw f32 HWC)

#include "clip.h"
#include "clip-impl.h"
#include "clip-model.h"
#include "mtmd-image.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "llama_clip_bench: %s\n", msg.c_str());
    std::exit(1);
}

// VTIMG: 8-byte magic "VTIMG01\n", then little-endian int32 dtype (0 = f32, 1 = u8), n, h, w;
// then n*h*w*3 values, HWC per image, images in order.
struct images_file {
    int dtype = 0;
    int n = 0, h = 0, w = 0;
    std::vector<float> f32;
    std::vector<uint8_t> u8;
};

images_file read_images(const std::string & path) {
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) die("cannot open " + path);
    char magic[8];
    int32_t hdr[4];
    if (std::fread(magic, 1, 8, f) != 8 || std::memcmp(magic, "VTIMG01\n", 8) != 0 ||
        std::fread(hdr, 4, 4, f) != 4) {
        std::fclose(f);
        die(path + ": not a VTIMG01 file");
    }
    images_file im;
    im.dtype = hdr[0];
    im.n = hdr[1];
    im.h = hdr[2];
    im.w = hdr[3];
    if ((im.dtype != 0 && im.dtype != 1) || im.n <= 0 || im.h <= 0 || im.w <= 0) {
        std::fclose(f);
        die(path + ": bad header (dtype " + std::to_string(im.dtype) + ", n " + std::to_string(im.n) +
            ", h " + std::to_string(im.h) + ", w " + std::to_string(im.w) + ")");
    }
    const size_t count = (size_t) im.n * im.h * im.w * 3;
    size_t got;
    if (im.dtype == 0) {
        im.f32.resize(count);
        got = std::fread(im.f32.data(), 4, count, f);
    } else {
        im.u8.resize(count);
        got = std::fread(im.u8.data(), 1, count, f);
    }
    std::fclose(f);
    if (got != count) die(path + ": " + std::to_string(got) + " values, header says " + std::to_string(count));
    return im;
}

// The clip_image_f32 entries for image i: its pixels as they are (f32), or llama.cpp's own
// preprocessing of the decoded image (u8).
std::vector<clip_image_f32> entries_for(const clip_ctx * ctx, const images_file & im, int i) {
    const size_t plane = (size_t) im.h * im.w * 3;
    if (im.dtype == 0) {
        clip_image_f32 img;
        img.set_size({im.w, im.h}, false, false);
        img.cpy_buf(std::vector<float>(im.f32.begin() + i * plane, im.f32.begin() + (i + 1) * plane));
        return {std::move(img)};
    }
    clip_image_u8 u;
    u.set_size({im.w, im.h}, false);
    u.cpy_buf(std::vector<uint8_t>(im.u8.begin() + i * plane, im.u8.begin() + (i + 1) * plane));
    std::unique_ptr<mtmd_image_preprocessor> pre;
    switch (clip_get_projector_type(ctx)) {
        case PROJECTOR_TYPE_GEMMA4V:
        case PROJECTOR_TYPE_GLM4V:
            pre = std::make_unique<mtmd_image_preprocessor_dyn_size>(ctx);  // as mtmd.cpp picks it
            break;
        case PROJECTOR_TYPE_GLM5V:
            pre = std::make_unique<mtmd_image_preprocessor_glm5v>(ctx);
            break;
        default:
            die("own preprocessing (u8 input) is wired for gemma4v, glm4v and glm5v only");
    }
    mtmd_image_preproc_out out = pre->preprocess(u);
    if (out.has_overview()) die("the preprocessor made an overview image: not handled here");
    return std::move(out.entries);
}

// Median of a sorted vector, the element the other sides report: sorted[n / 2].
double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Upload of `in_bytes` and download of `out_bytes` through ggml-backend on the device clip runs on
// (the first GPU device, or the CPU with --cpu): median of 10 after 2 warm-ups, in ms.
std::pair<double, double> transfer_ms(bool cpu, size_t in_bytes, size_t out_bytes) {
    ggml_backend_dev_t dev = cpu ? ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
                                 : ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
    if (!dev) return {NAN, NAN};
    ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);
    if (!be) return {NAN, NAN};
    ggml_init_params p = {2 * ggml_tensor_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) in_bytes);
    ggml_tensor * b = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) out_bytes);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    std::vector<uint8_t> hin(in_bytes, 1), hout(out_bytes);
    std::vector<double> up, down;
    for (int it = 0; it < 12; ++it) {
        auto t0 = clock_type::now();
        ggml_backend_tensor_set(a, hin.data(), 0, in_bytes);
        double u = ms_since(t0);
        t0 = clock_type::now();
        ggml_backend_tensor_get(b, hout.data(), 0, out_bytes);
        double d = ms_since(t0);
        if (it >= 2) {
            up.push_back(u);
            down.push_back(d);
        }
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(be);
    return {median_of(up), median_of(down)};
}

std::string json_list(const std::vector<double> & v) {
    std::string s = "[";
    char tmp[32];
    for (size_t i = 0; i < v.size(); ++i) {
        std::snprintf(tmp, sizeof tmp, "%s%.4f", i ? ", " : "", v[i]);
        s += tmp;
    }
    return s + "]";
}

std::string json_str(const std::string & v) {
    std::string s = "\"";
    for (char c : v) {
        if (c == '"' || c == '\\') s += '\\';
        s += c;
    }
    return s + "\"";
}

}  // namespace

int main(int argc, char ** argv) {
    std::string mmproj, input, out, dump_pixels;
    int iters = 20, warmup = 3;
    int threads = (int) std::max(1u, std::thread::hardware_concurrency());
    bool cpu = false;
    int min_tokens = -1, max_tokens = -1;
    std::string fa = "auto";
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) die("missing value for " + a);
            return argv[++i];
        };
        if (a == "--mmproj") mmproj = next();
        else if (a == "--input") input = next();
        else if (a == "--out") out = next();
        else if (a == "--dump-pixels") dump_pixels = next();
        else if (a == "--iters") iters = std::atoi(next().c_str());
        else if (a == "--warmup") warmup = std::atoi(next().c_str());
        else if (a == "--threads") threads = std::atoi(next().c_str());
        else if (a == "--cpu") cpu = true;
        else if (a == "--flash-attn") fa = next();
        else if (a == "--min-tokens") min_tokens = std::atoi(next().c_str());
        else if (a == "--max-tokens") max_tokens = std::atoi(next().c_str());
        else die("unknown argument " + a +
                 " (usage: --mmproj F.gguf --input F.vtimg [--out rows.f32] [--iters N] [--warmup N] "
                 "[--cpu] [--threads N] [--flash-attn auto|on|off] [--min-tokens N] [--max-tokens N])");
    }
    if (mmproj.empty() || input.empty()) die("--mmproj and --input are required");
    if (iters < 1) die("--iters must be >= 1");
    clip_flash_attn_type fa_type = fa == "on"    ? CLIP_FLASH_ATTN_TYPE_ENABLED
                                   : fa == "off" ? CLIP_FLASH_ATTN_TYPE_DISABLED
                                                 : CLIP_FLASH_ATTN_TYPE_AUTO;

    // clip's debug lines (one per image per call) off, as mtmd's callers set it; the rest to stderr.
    g_logger_state.log_callback = [](ggml_log_level level, const char * text, void *) {
        if (level != GGML_LOG_LEVEL_DEBUG) {
            std::fputs(text, stderr);
        }
    };
    ggml_backend_load_all();  // no-op for the static backends linked in; kept for a shared build
    const images_file im = read_images(input);

    clip_context_params cp{};
    cp.use_gpu = !cpu;
    cp.device = nullptr;
    cp.flash_attn_type = fa_type;
    cp.image_min_tokens = min_tokens;  // own preprocessing only: the token budget (-1: llama.cpp's)
    cp.image_max_tokens = max_tokens;
    cp.warmup = true;  // clip's own warm-up graph, as mtmd does
    cp.cb_eval = nullptr;
    cp.cb_eval_user_data = nullptr;
    cp.no_alloc = false;
    cp.progress_callback = nullptr;
    cp.progress_callback_user_data = nullptr;
    auto t_load = clock_type::now();
    clip_init_result res = clip_init(mmproj.c_str(), cp);
    const double load_ms = ms_since(t_load);
    clip_ctx * ctx = res.ctx_v;
    if (!ctx) die("clip_init failed for " + mmproj);
    const bool batched = clip_support_batch(ctx);
    const int width = clip_n_mmproj_embd(ctx);

    clip_image_f32_batch batch;
    for (int i = 0; i < im.n; ++i) {
        for (auto & e : entries_for(ctx, im, i)) batch.entries.push_back(std::move(e));
    }
    const int n_entries = (int) batch.entries.size();
    if (!dump_pixels.empty()) {  // the clip_image_f32 entries as clip gets them (after own preprocessing)
        FILE * f = std::fopen(dump_pixels.c_str(), "wb");
        if (!f) die("cannot write " + dump_pixels);
        for (const auto & e : batch.entries) {
            const auto & b = e.get_ro_buf();
            std::fwrite(b.data(), sizeof(float), b.size(), f);
        }
        std::fclose(f);
    }
    std::vector<int> rows_per_entry;
    size_t total_rows = 0;
    for (const auto & e : batch.entries) {
        rows_per_entry.push_back(clip_n_output_tokens(ctx, &e));
        total_rows += rows_per_entry.back();
    }

    std::vector<float> rows(total_rows * (size_t) width, NAN);  // poisoned: every value must be written
    // clip_encode copies the rows only into an output vector of exactly the graph's size.
    std::vector<std::vector<float>> outs;
    if (!batched) {
        for (int i = 0; i < n_entries; ++i) outs.emplace_back((size_t) rows_per_entry[i] * width);
    }
    auto encode_all = [&]() {
        if (batched) {
            if (!clip_image_batch_encode(ctx, threads, &batch, rows)) die("clip_image_batch_encode failed");
        } else {
            size_t off = 0;
            for (int i = 0; i < n_entries; ++i) {
                if (!clip_image_encode(ctx, threads, &batch.entries[i], outs[i])) die("clip_image_encode failed");
                std::memcpy(rows.data() + off, outs[i].data(), outs[i].size() * sizeof(float));
                off += outs[i].size();
            }
        }
    };

    for (int i = 0; i < warmup; ++i) encode_all();
    std::vector<double> ts;
    for (int i = 0; i < iters; ++i) {
        auto t0 = clock_type::now();
        encode_all();
        ts.push_back(ms_since(t0));
    }
    std::vector<double> sorted = ts;
    std::sort(sorted.begin(), sorted.end());

    size_t nonfinite = 0;
    for (float v : rows) nonfinite += !std::isfinite(v);
    if (!out.empty()) {
        FILE * f = std::fopen(out.c_str(), "wb");
        if (!f || std::fwrite(rows.data(), sizeof(float), rows.size(), f) != rows.size()) die("cannot write " + out);
        std::fclose(f);
    }

    size_t in_bytes = 0;
    for (const auto & e : batch.entries) in_bytes += e.n_elements() * sizeof(float);
    auto [up_ms, down_ms] = transfer_ms(cpu, in_bytes, rows.size() * sizeof(float));

    const auto & e0 = batch.entries[0];
    std::printf(
        "{\"mmproj\": %s, \"projector\": %s, \"device\": \"%s\", \"flash_attn\": \"%s\", \"threads\": %d, "
        "\"input\": \"%s\", \"images\": %d, \"entries\": %d, \"entry_size\": [%d, %d], \"batched\": %s, "
        "\"rows\": %zu, \"width\": %d, \"nonfinite\": %zu, \"load_ms\": %.1f, \"warmup\": %d, \"iters\": %d, "
        "\"median_ms\": %.4f, \"min_ms\": %.4f, \"times_ms\": %s, \"upload_ms\": %.4f, \"download_ms\": %.4f}\n",
        json_str(mmproj).c_str(), json_str(PROJECTOR_TYPE_NAMES[clip_get_projector_type(ctx)]).c_str(),
        cpu ? "cpu" : "gpu", fa.c_str(), threads, im.dtype == 0 ? "f32 pixels as given" : "u8, llama.cpp preprocessing",
        im.n, n_entries, e0.nx(), e0.ny(), batched ? "true" : "false", total_rows, width, nonfinite, load_ms, warmup,
        iters, median_of(ts), sorted[0], json_list(ts).c_str(), up_ms, down_ms);
    clip_free(ctx);
    return nonfinite ? 2 : 0;
}
