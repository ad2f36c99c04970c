/*
 * encode: open a model, plan one image from its header, encode it, print what came back.
 *
 *   cc -std=c99 -I crates/vision-towers-c/include crates/vision-towers-c/examples/c/encode.c \
 *      -L target/release -lvision_towers_c -Wl,-rpath,"$PWD/target/release" -o encode
 *   ./encode fixtures/models/gemma4 fixtures/images/coffee_144x96.jpg [auto|cpu|cuda:N [ROWS.f32]]
 *
 * With ROWS.f32 it also writes the rows there, raw little-endian f32, row-major [rows, width].
 * Built from an unpacked release tarball with pkg-config instead (the tarball's README.md):
 *
 *   cc -std=c99 $(pkg-config --cflags vision_towers) encode.c -o encode \
 *      $(pkg-config --libs vision_towers) -Wl,-rpath,"$(pkg-config --variable=libdir vision_towers)"
 */
#include "vision_towers.h"

#include <stdio.h>
#include <stdlib.h>

static int fail(const char *call, vt_status s) {
    fprintf(stderr, "%s: %s: %s\n", call, vt_status_name(s), vt_last_error());
    return 1;
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = n > 0 ? (size_t)n : 0;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL IMAGE [DEVICE [ROWS.f32]]\n", argv[0]);
        return 2;
    }
    if (vt_abi_version() != VT_ABI_VERSION) {
        fprintf(stderr, "vision_towers.h is ABI %u, the library %u\n", VT_ABI_VERSION,
                vt_abi_version());
        return 2;
    }
    size_t len = 0;
    unsigned char *bytes = read_file(argv[2], &len);
    if (!bytes) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 2;
    }

    vt_open_options options = vt_open_options_default();
    options.device = argc > 3 ? argv[3] : "auto";
    vt_model *model = NULL;
    vt_status s = vt_model_open(argv[1], &options, &model);
    if (s != VT_OK) {
        free(bytes);
        return fail("vt_model_open", s);
    }
    printf("vision-towers %s: family %s, LM width %zu, on %s\n", vt_version(),
           vt_model_family_name(model), vt_model_width(model),
           vt_model_device_ordinal(model) < 0 ? "the CPU" : "CUDA");

    /* The plan, from the header alone: how the prompt holds this image. */
    vt_image image = {bytes, len, VT_IMAGE_BYTES};
    vt_plan *plan = NULL;
    s = vt_model_plan(model, &image, &plan);
    if (s != VT_OK) {
        vt_model_free(model);
        free(bytes);
        return fail("vt_model_plan", s);
    }
    printf("plan: %ux%u -> %llux%llu, %llu rows\n", vt_plan_image_width(plan),
           vt_plan_image_height(plan), (unsigned long long)vt_plan_target_width(plan),
           (unsigned long long)vt_plan_target_height(plan),
           (unsigned long long)vt_plan_rows(plan));
    for (size_t i = 0; i < vt_plan_run_count(plan); i++)
        printf("  %s x %llu%s\n", vt_plan_run_text(plan, i),
               (unsigned long long)vt_plan_run_counts(plan)[i],
               vt_plan_run_embeds(plan)[i] ? "  <- the rows go here" : "");
    vt_plan_free(plan);

    /* The rows (f32 on the host; vt_model_encode_device leaves them on the GPU). */
    vt_rows *rows = NULL;
    s = vt_model_encode(model, &image, 1, &rows);
    if (s != VT_OK) {
        vt_model_free(model);
        free(bytes);
        return fail("vt_model_encode", s);
    }
    size_t n = vt_rows_count(rows), width = vt_rows_width(rows);
    const float *data = vt_rows_data(rows);
    printf("rows %zu width %zu, first values %g %g %g\n", n, width, data[0], data[1], data[2]);
    if (argc > 4) {
        FILE *out = fopen(argv[4], "wb");
        size_t written = out ? fwrite(data, sizeof(float), n * width, out) : 0;
        if (!out || written != n * width || fclose(out) != 0) {
            fprintf(stderr, "cannot write %s\n", argv[4]);
            vt_rows_free(rows);
            vt_model_free(model);
            free(bytes);
            return 1;
        }
    }

    vt_rows_free(rows);
    vt_model_free(model);
    free(bytes);
    return 0;
}
