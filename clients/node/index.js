// ES module entry: the CommonJS implementation in `index.cjs`, re-exported,
// so a program that both imports and requires the package gets one client
// and one `RatewardenError`.
import cjs from './index.cjs';

export const { createClient, rateLimit, settleOutcome, RatewardenError } = cjs;
export default cjs;
