// CRC-32C (Castagnoli), the checksum of checkpoint files: the SSE4.2
// instruction where the processor has it, a table otherwise (same values).
#pragma once

#include <cstddef>
#include <cstdint>

namespace smp {

// Continues `crc` (0 to start) over `size` bytes.
uint32_t crc32c(uint32_t crc, const void* data, size_t size);

}  // namespace smp
