// engine: how a C++ inference engine calls vision-towers where it would call its own vision
// encoder, in the shape of llama.cpp's mtmd (tokenize -> encode chunk -> output embeddings ->
// decode with the attention law for image spans).
/*
 *   c++ -std=c++17 -I crates/vision-towers-c/include \
 *       crates/vision-towers-c/examples/cpp/engine.cpp target/release/libvision_towers_c.a \
 *       -lpthread -ldl -lm -lrt -lutil -lgcc_s -o engine
 *   ./engine [-o ROWS.f32] fixtures/models/glm5_next cpu fixtures/images/tiny_20x15.png ...
 *
 * `-o` also writes the rows spliced in (every image's, in order) there, raw little-endian f32,
 * row-major [rows, width]. CMakeLists.txt beside it builds it against an installed or unpacked
 * release (find_package(vision_towers)).
 */
#include "vision_towers.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace vt {

// Every handle owned once, freed by its _free (which accepts NULL).
struct ModelFree { void operator()(vt_model *m) const { vt_model_free(m); } };
struct PlanFree { void operator()(vt_plan *p) const { vt_plan_free(p); } };
struct RowsFree { void operator()(vt_rows *r) const { vt_rows_free(r); } };
using Model = std::unique_ptr<vt_model, ModelFree>;
using Plan = std::unique_ptr<vt_plan, PlanFree>;
using Rows = std::unique_ptr<vt_rows, RowsFree>;

// A refusal as an exception: the status and the thread's last message, read at once.
struct Error : std::runtime_error {
    vt_status status;
    Error(const char *call, vt_status s)
        : std::runtime_error(std::string(call) + ": " + vt_status_name(s) + ": " +
                             vt_last_error()),
          status(s) {}
};

inline void check(const char *call, vt_status s) {
    if (s != VT_OK) throw Error(call, s);
}

}  // namespace vt

// One prompt position: a token id, or (embedding) the next row of the image's rows.
struct Position {
    uint32_t token;
    bool embedding;
};

int main(int argc, char **argv) try {
    const char *prog = argv[0], *rows_out = nullptr;
    if (argc > 2 && std::string(argv[1]) == "-o") {
        rows_out = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s [-o ROWS.f32] MODEL DEVICE IMAGE...\n", prog);
        return 2;
    }
    // Load the files (an engine has them from its request already).
    std::vector<std::vector<unsigned char>> files;
    std::vector<vt_image> images;
    for (int i = 3; i < argc; i++) {
        std::ifstream f(argv[i], std::ios::binary);
        files.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    for (auto &f : files) images.push_back(vt_image{f.data(), f.size(), VT_IMAGE_BYTES});

    // Once per model: the encoder context (mtmd_init_from_file).
    vt_open_options options = vt_open_options_default();
    options.device = argv[2];
    vt_model *raw = nullptr;
    vt::check("vt_model_open", vt_model_open(argv[1], &options, &raw));
    vt::Model model(raw);
    const size_t width = vt_model_width(model.get());

    // How the LM must attend over image rows (mtmd_decode_use_non_causal): an engine refuses a
    // serving path that cannot honour it.
    switch (vt_model_lm_attention(model.get())) {
    case VT_LM_ATTENTION_CAUSAL: std::printf("attention: causal\n"); break;
    case VT_LM_ATTENTION_BIDIRECTIONAL_IMAGE_RUNS_IN_SLIDING_LAYERS:
        std::printf("attention: bidirectional within image runs (sliding layers)\n");
        break;
    case VT_LM_ATTENTION_BIDIRECTIONAL: std::printf("attention: bidirectional\n"); break;
    }

    // "Tokenize" (mtmd_tokenize): each image's token runs from its header alone, so the prompt
    // is laid out (and its length known) before a pixel is decoded.
    std::vector<Position> prompt;
    size_t placeholders = 0;
    for (const vt_image &image : images) {
        vt_plan *p = nullptr;
        vt::check("vt_model_plan", vt_model_plan(model.get(), &image, &p));
        vt::Plan plan(p);
        const uint32_t *ids = vt_plan_run_ids(plan.get());
        const uint64_t *counts = vt_plan_run_counts(plan.get());
        const uint8_t *embeds = vt_plan_run_embeds(plan.get());
        for (size_t r = 0; r < vt_plan_run_count(plan.get()); r++) {
            for (uint64_t k = 0; k < counts[r]; k++) prompt.push_back({ids[r], embeds[r] != 0});
            if (embeds[r]) placeholders += counts[r];
        }
    }
    std::printf("prompt: %zu positions, %zu image placeholders\n", prompt.size(), placeholders);

    // "Encode the chunk" (mtmd_encode_chunk): all images in one call, in padding-free passes.
    vt_rows *r = nullptr;
    vt::check("vt_model_encode",
              vt_model_encode(model.get(), images.data(), images.size(), &r));
    vt::Rows rows(r);

    // "Output embeddings" (mtmd_get_output_embd): splice the rows into the prompt's embedding
    // matrix at the placeholders, in order; text positions would take the LM's token embeddings.
    if (vt_rows_count(rows.get()) != placeholders) {
        std::fprintf(stderr, "rows %zu != placeholders %zu\n", vt_rows_count(rows.get()),
                     placeholders);
        return 1;
    }
    std::vector<float> embeddings(prompt.size() * width, 0.0f);
    const float *data = vt_rows_data(rows.get());
    size_t next = 0;
    double checksum = 0.0;
    for (size_t i = 0; i < prompt.size(); i++) {
        if (!prompt[i].embedding) continue;
        for (size_t c = 0; c < width; c++) {
            embeddings[i * width + c] = data[next * width + c];
            checksum += data[next * width + c];
        }
        next++;
    }
    std::printf("embedded %zu rows of width %zu into %zu positions\n", next, width, prompt.size());
    std::printf("checksum %.17g\n", checksum);
    if (rows_out) {
        std::ofstream out(rows_out, std::ios::binary);
        out.write(reinterpret_cast<const char *>(data),
                  static_cast<std::streamsize>(next * width * sizeof(float)));
        if (!out) {
            std::fprintf(stderr, "cannot write %s\n", rows_out);
            return 1;
        }
    }
    return 0;
} catch (const vt::Error &e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
}
