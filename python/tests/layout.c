/* layout.c — prints the size and member offsets of every struct the Python package mirrors with
 * ctypes, as JSON, so test_layout.py can compare them with its own. */
#include <ferry.h>
#include <stddef.h>
#include <stdio.h>

#define BEGIN(T) printf("%s\"%s\": {\"size\": %zu", first ? "" : ", ", #T, sizeof(T)), first = 0
#define M(T, m) printf(", \"%s\": %zu", #m, offsetof(T, m))
#define END() printf("}")

int main(void)
{
    int first = 1;
    printf("{");
    BEGIN(ferry_tensor_info); M(ferry_tensor_info, name); M(ferry_tensor_info, file);
    M(ferry_tensor_info, format); M(ferry_tensor_info, dtype); M(ferry_tensor_info, ndim);
    M(ferry_tensor_info, shape); M(ferry_tensor_info, n_elems); M(ferry_tensor_info, row_elems);
    M(ferry_tensor_info, n_rows); M(ferry_tensor_info, offset); M(ferry_tensor_info, nbytes); END();
    BEGIN(ferry_value); M(ferry_value, type); M(ferry_value, v); END();
    BEGIN(ferry_policy); M(ferry_policy, home); M(ferry_policy, compute_device);
    M(ferry_policy, load); M(ferry_policy, lazy); M(ferry_policy, lazy_threshold);
    M(ferry_policy, lock); M(ferry_policy, convert); M(ferry_policy, compute_dtype);
    M(ferry_policy, n_split); M(ferry_policy, split_devices); M(ferry_policy, split_weights);
#ifdef FERRY_LAYOUT_WRITABLE
    M(ferry_policy, writable);
#ifdef FERRY_LAYOUT_SLICE
    M(ferry_policy, experts);
#endif
#endif
    END();
    BEGIN(ferry_options); M(ferry_options, io_threads); M(ferry_options, host_budget);
    M(ferry_options, no_schedule); M(ferry_options, slice_evict);
    M(ferry_options, io_request_bytes); END();
    BEGIN(ferry_device_info); M(ferry_device_info, name); M(ferry_device_info, kind);
    M(ferry_device_info, total_bytes); M(ferry_device_info, free_bytes);
    M(ferry_device_info, budget); M(ferry_device_info, used_bytes);
    M(ferry_device_info, host_accessible); END();
    BEGIN(ferry_tensor_part); M(ferry_tensor_part, device); M(ferry_tensor_part, row0);
    M(ferry_tensor_part, n_rows); M(ferry_tensor_part, data); M(ferry_tensor_part, nbytes); END();
    BEGIN(ferry_lora_options); M(ferry_lora_options, base_prefix);
    M(ferry_lora_options, target_prefix); M(ferry_lora_options, required); END();
    BEGIN(ferry_lora_info); M(ferry_lora_info, path); M(ferry_lora_info, scheme);
    M(ferry_lora_info, multiplier); M(ferry_lora_info, n_pairs); M(ferry_lora_info, n_matched);
    M(ferry_lora_info, n_unmatched); M(ferry_lora_info, unmatched); M(ferry_lora_info, skipped);
    M(ferry_lora_info, factor_bytes); END();
    BEGIN(ferry_lora_factor); M(ferry_lora_factor, a); M(ferry_lora_factor, b);
    M(ferry_lora_factor, rank); M(ferry_lora_factor, rows); M(ferry_lora_factor, cols);
    M(ferry_lora_factor, scale); M(ferry_lora_factor, adapter); END();
    BEGIN(ferry_placement); M(ferry_placement, name); M(ferry_placement, group);
    M(ferry_placement, home); M(ferry_placement, compute_device); M(ferry_placement, lazy);
    M(ferry_placement, zero_copy); M(ferry_placement, home_bytes);
    M(ferry_placement, compute_bytes); END();
    BEGIN(ferry_plan_totals); M(ferry_plan_totals, host_bytes); M(ferry_plan_totals, mapped_bytes);
    M(ferry_plan_totals, disk_bytes); M(ferry_plan_totals, device_bytes);
    M(ferry_plan_totals, staged_bytes); END();
    BEGIN(ferry_stats); M(ferry_stats, resident_bytes); M(ferry_stats, peak_bytes);
    M(ferry_stats, home_host_bytes); M(ferry_stats, home_device_bytes);
    M(ferry_stats, cached_bytes); M(ferry_stats, bytes_read); M(ferry_stats, bytes_copied);
    M(ferry_stats, prepares); M(ferry_stats, prefetch_hits); M(ferry_stats, prefetch_misses);
    M(ferry_stats, evictions); M(ferry_stats, locked_bytes); M(ferry_stats, lock_failures);
    M(ferry_stats, wait_seconds); M(ferry_stats, guess_bytes); M(ferry_stats, guess_unused_bytes);
    M(ferry_stats, faulted_ahead_bytes);
    END();
    printf("}\n");
    return 0;
}
